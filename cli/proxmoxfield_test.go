package cli

import (
	"strings"
	"testing"
)

// TestProxmoxFieldSettings: PROXMOX_RESOURCE_POOL and
// PROXMOX_CPU_OVERCOMMIT are read, and bad values are refused naming the
// variable and the rule.
func TestProxmoxFieldSettings(t *testing.T) {
	for _, tc := range []struct {
		pool, ratio string
		wantErr     string
		wantPool    string
		wantRatio   float64
	}{
		{"delegate-jobs", "4", "", "delegate-jobs", 4},
		{"parent/jobs_1", "", "", "parent/jobs_1", 0},
		{"", "0", "", "", 0},
		{"has space", "", "PROXMOX_RESOURCE_POOL=", "", 0},
		{"", "-1", "PROXMOX_CPU_OVERCOMMIT=", "", 0},
		{"", "lots", "PROXMOX_CPU_OVERCOMMIT=", "", 0},
		{"", "NaN", "PROXMOX_CPU_OVERCOMMIT=", "", 0},
	} {
		c, err := LoadConfig(func(k string) string {
			return map[string]string{"DELEGATE_BACKEND": "proxmox", "PROXMOX_HOST": "pve", "PROXMOX_USER": "u@pve", "PROXMOX_TOKEN_NAME": "tk",
				"PROXMOX_TOKEN_VALUE": "v", "DEFAULT_VM_TEMPLATE": "tpl",
				"PROXMOX_RESOURCE_POOL": tc.pool, "PROXMOX_CPU_OVERCOMMIT": tc.ratio}[k]
		})
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q %q: %v", tc.pool, tc.ratio, err)
			}
		case err != nil || c.ProxmoxResourcePool != tc.wantPool || c.ProxmoxCPUOvercommit != tc.wantRatio:
			t.Errorf("%q %q: %q %v %v", tc.pool, tc.ratio, c.ProxmoxResourcePool, c.ProxmoxCPUOvercommit, err)
		}
	}
}
