package pvesim

import (
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestSchemaCoverage: the simulator serves exactly the subset's methods,
// and each is a method of the real API.
func TestSchemaCoverage(t *testing.T) {
	s, err := LoadSchema()
	if err != nil {
		t.Fatal(err)
	}
	if s.PVE != "9.x" {
		t.Errorf("schema version %q, want 9.x", s.PVE)
	}
	var served []string
	for _, m := range s.Methods() {
		key := m.Method + " " + m.Path
		served = append(served, key)
		if handlers[key] == nil {
			t.Errorf("%s: in the schema subset, no handler", key)
		}
		if !s.InRealAPI(m.Method, m.Path) {
			t.Errorf("%s: not a method of the real API", key)
		}
		if !m.AllowToken {
			t.Errorf("%s: refuses API tokens; delegate only has tokens", key)
		}
	}
	for key := range handlers {
		if !slices.Contains(served, key) {
			t.Errorf("%s: handler without schema", key)
		}
	}
	if len(served) != 83 {
		t.Errorf("%d methods, want 83", len(served))
	}
	t.Logf("named formats accepted unchecked: %v", Unchecked(s))
	if !s.InRealAPI("POST", "/access/ticket") || s.InRealAPI("GET", "/nodes/pve1/nonsense") {
		t.Error("InRealAPI does not know the full API")
	}
	// The PVE 8.4 subset has the same methods.
	s8, err := LoadSchemaFor("8.4")
	if err != nil {
		t.Fatal(err)
	}
	if s8.PVE != "8.4" {
		t.Errorf("PVE 8 schema version %q", s8.PVE)
	}
	var served8 []string
	for _, m := range s8.Methods() {
		served8 = append(served8, m.Method+" "+m.Path)
		if !m.AllowToken {
			t.Errorf("PVE 8 %s %s: refuses API tokens", m.Method, m.Path)
		}
	}
	if !slices.Equal(served, served8) {
		t.Errorf("PVE 8 subset %v, PVE 9 subset %v", served8, served)
	}
}

func TestValidate(t *testing.T) {
	s, err := LoadSchema()
	if err != nil {
		t.Fatal(err)
	}
	const vm = "/nodes/pve1/qemu/100"
	tests := []struct {
		name   string
		method string
		path   string
		params Params
		want   map[string]string // nil: valid
	}{
		{"clone ok", "POST", "/nodes/pve1/qemu/9000/clone", Params{"newid": "101", "name": "job-1", "full": "0"}, nil},
		{"clone JSON types", "POST", "/nodes/pve1/qemu/9000/clone", Params{"newid": "101", "full": true}, nil},
		{"missing required", "POST", "/nodes/pve1/qemu/9000/clone", Params{}, map[string]string{
			"newid": "property is missing and it is not optional"}},
		{"unknown parameter", "POST", "/nodes/pve1/qemu/9000/clone", Params{"newid": "101", "linked": "1"}, map[string]string{
			"linked": "property is not defined in schema and the schema does not allow additional properties"}},
		{"boolean as true", "POST", "/nodes/pve1/qemu/9000/clone", Params{"newid": "101", "full": "true"}, map[string]string{
			"full": "type check ('boolean') failed - got 'true'"}},
		{"integer as text", "POST", "/nodes/pve1/qemu/9000/clone", Params{"newid": "abc"}, map[string]string{
			"newid": "type check ('integer') failed - got 'abc'"}},
		{"JSON boolean for an integer", "POST", "/nodes/pve1/qemu/9000/clone", Params{"newid": true}, map[string]string{
			"newid": "type check ('integer') failed - got JSON::PP::Boolean"}},
		// The format comes before minimum and maximum in check_prop.
		{"vmid below 100", "POST", "/nodes/pve1/qemu/9000/clone", Params{"newid": "99"}, map[string]string{
			"newid": "invalid format - value does not look like a valid VM ID\n"}},
		{"vmid too long", "POST", "/nodes/pve1/qemu/9000/clone", Params{"newid": "1000000000"}, map[string]string{
			"newid": "invalid format - value does not look like a valid VM ID\n"}},
		{"below minimum", "POST", "/nodes/pve1/qemu/100/status/start", Params{"timeout": "-1"}, map[string]string{
			"timeout": "value must have a minimum value of 0"}},
		{"above maximum", "POST", "/nodes/pve1/qemu/100/config", Params{"background_delay": "31"}, map[string]string{
			"background_delay": "value must have a maximum value of 30"}},
		{"vmid in the path", "GET", "/nodes/pve1/qemu/abc/config", nil, map[string]string{
			"vmid": "type check ('integer') failed - got 'abc'"}},
		{"format dns-name", "POST", "/nodes/pve1/qemu/9000/clone", Params{"newid": "101", "name": "job_1"}, map[string]string{
			"name": "invalid format - value does not look like a valid DNS name\n"}},
		{"format pve-node", "POST", "/nodes/pve1/qemu/9000/clone", Params{"newid": "101", "target": "pve_2"}, map[string]string{
			"target": "invalid format - value does not look like a valid node name\n"}},
		{"bad enum", "POST", "/nodes/pve1/qemu/9000/clone", Params{"newid": "101", "format": "vdi"}, map[string]string{
			"format": "value 'vdi' does not have a value in the enumeration 'raw, qcow2, vmdk'"}},
		{"enum of resources", "GET", "/cluster/resources", Params{"type": "qemu"}, map[string]string{
			"type": "value 'qemu' does not have a value in the enumeration 'vm, storage, node, sdn'"}},
		{"pattern", "PUT", vm + "/resize", Params{"disk": "scsi0", "size": "10GB"}, map[string]string{
			"size": "value does not match the regex pattern"}},
		{"pattern before final newline, like Perl", "PUT", vm + "/resize", Params{"disk": "scsi0", "size": "+1G\n"}, nil},
		{"maxLength", "POST", vm + "/agent/file-write", Params{"file": "/tmp/x", "content": strings.Repeat("a", 61441)}, map[string]string{
			"content": "value may only be 61440 characters long"}},
		{"maxLength counts characters", "POST", vm + "/agent/file-write", Params{"file": "/tmp/x", "content": strings.Repeat("é", 61440)}, nil},
		{"tags", "PUT", vm + "/config", Params{"tags": "a;b c,d"}, nil},
		{"bad tag", "PUT", vm + "/config", Params{"tags": "ok;no/slash"}, map[string]string{
			"tags": "invalid format - invalid characters in tag\n"}},
		{"description too long", "PUT", vm + "/config", Params{"description": strings.Repeat("x", 8193)}, map[string]string{
			"description": "value may only be 8192 characters long"}},
		{"net0 property string", "PUT", vm + "/config", Params{"net0": "virtio,bridge=vmbr0,firewall=1"}, nil},
		{"net0 with MAC", "PUT", vm + "/config", Params{"net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0"}, nil},
		{"net0 bad key", "PUT", vm + "/config", Params{"net0": "virtio,bridge=vmbr0,speed=10"}, map[string]string{
			"net0": "invalid format - invalid key in comma-separated list property: speed\n"}},
		{"net0 bad model", "PUT", vm + "/config", Params{"net0": "rtl9999,bridge=vmbr0"}, map[string]string{
			"net0": "invalid format - format error\nnet0.model: value 'rtl9999' does not have a value in the enumeration 'e1000, e1000-82540em, e1000-82544gc, e1000-82545em, e1000e, i82551, i82557b, i82559er, ne2k_isa, ne2k_pci, pcnet, rtl8139, virtio, vmxnet3'\n"}},
		{"net0 multicast MAC", "PUT", vm + "/config", Params{"net0": "virtio=01:00:00:00:00:01"}, map[string]string{
			"net0": "invalid format - format error\nnet0.macaddr: invalid format - value does not look like a valid unicast MAC address\n\n"}},
		{"net99 does not exist", "PUT", vm + "/config", Params{"net99": "virtio"}, map[string]string{
			"net99": "property is not defined in schema and the schema does not allow additional properties"}},
		{"memory property string", "PUT", vm + "/config", Params{"memory": "4096"}, nil},
		{"memory too small", "PUT", vm + "/config", Params{"memory": "8"}, map[string]string{
			"memory": "invalid format - format error\nmemory.current: value must have a minimum value of 16\n"}},
		{"cores", "PUT", vm + "/config", Params{"cores": "0"}, map[string]string{
			"cores": "value must have a minimum value of 1"}},
		{"agent", "PUT", vm + "/config", Params{"agent": "enabled=1,fstrim_cloned_disks=1"}, nil},
		{"delete list", "PUT", vm + "/config", Params{"delete": "tags,description"}, nil},
		{"delete bad id", "PUT", vm + "/config", Params{"delete": "tags,1bad"}, map[string]string{
			"delete": "invalid format - invalid configuration ID '1bad'\n"}},
		{"sshkeys urlencoded", "PUT", vm + "/config", Params{"sshkeys": "ssh-rsa AAAA"}, map[string]string{
			"sshkeys": "invalid format - invalid urlencoded string: ssh-rsa AAAA\n"}},
		{"ipconfig", "PUT", vm + "/config", Params{"ipconfig0": "ip=10.0.0.5/24,gw=10.0.0.1"}, nil},
		{"ipconfig dhcp", "PUT", vm + "/config", Params{"ipconfig0": "ip=dhcp,ip6=auto"}, nil},
		{"ipconfig bad", "PUT", vm + "/config", Params{"ipconfig0": "ip=10.0.0.5"}, map[string]string{
			"ipconfig0": "invalid format - format error\nipconfig0.ip: invalid format - value does not look like a valid ipv4 network configuration\n\n"}},
		{"exec array", "POST", vm + "/agent/exec", Params{"command": []any{"/bin/sh", "-c", "echo hi"}}, nil},
		{"exec single value becomes an array", "POST", vm + "/agent/exec", Params{"command": "/bin/true"}, nil},
		{"exec \"0\" stays a string", "POST", vm + "/agent/exec", Params{"command": "0"}, map[string]string{
			"command": "type check ('array') failed"}},
		{"exec nested array", "POST", vm + "/agent/exec", Params{"command": []any{"a", []any{"b"}}}, map[string]string{
			"command[1]": "type check ('string') failed - got ARRAY"}},
		{"exec missing command", "POST", vm + "/agent/exec", Params{}, map[string]string{
			"command": "property is missing and it is not optional"}},
		{"exec-status pid", "GET", vm + "/agent/exec-status", Params{"pid": "12"}, nil},
		{"file-read count max (a string in the schema)", "GET", vm + "/agent/file-read", Params{"file": "/x", "count": "16777217"}, map[string]string{
			"count": "value must have a maximum value of 16777216"}},
		{"nextid", "GET", "/cluster/nextid", Params{"vmid": "99"}, map[string]string{
			"vmid": "invalid format - value does not look like a valid VM ID\n"}},
		{"path and body disagree", "POST", vm + "/agent/ping", Params{"vmid": "101"}, map[string]string{
			"vmid": "duplicate parameter (already defined in URI) with conflicting values!"}},
		{"path and body agree", "POST", vm + "/agent/ping", Params{"vmid": "100"}, nil},
		{"delete destroy options", "DELETE", vm, Params{"purge": "1", "destroy-unreferenced-disks": "1"}, nil},
		{"task log", "GET", "/nodes/pve1/tasks/UPID:pve1:00001234:0001E240:65000000:qmstart:100:root@pam!x:/log", Params{"start": "0", "limit": "-1"}, map[string]string{
			"limit": "value must have a minimum value of 0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := s.Validate(tt.method, tt.path, tt.params)
			var pe *ParamError
			if tt.want == nil {
				if err != nil {
					t.Fatalf("valid request refused: %v", err)
				}
				return
			}
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a ParamError", err)
			}
			if !reflect.DeepEqual(pe.Errors, tt.want) {
				t.Errorf("errors:\n got %q\nwant %q", pe.Errors, tt.want)
			}
		})
	}
}

func TestValidateUnknownRoute(t *testing.T) {
	s, _ := LoadSchema()
	if _, _, err := s.Validate("GET", "/nodes/pve1/network", nil); !errors.Is(err, ErrNotImplemented) {
		t.Errorf("network (not simulated): %v", err)
	}
	if _, _, err := s.Validate("PATCH", "/version", nil); !errors.Is(err, ErrNotImplemented) {
		t.Errorf("PATCH: %v", err)
	}
}

// TestLookupPrefersFixedSegments: /nodes/{node}/qemu/{vmid}/config is not
// taken for another template with a parameter there.
func TestLookupPrefersFixedSegments(t *testing.T) {
	s, _ := LoadSchema()
	m, p, ok := s.Lookup("GET", "/nodes/pve1/qemu/100/status/current")
	if !ok || m.Path != "/nodes/{node}/qemu/{vmid}/status/current" {
		t.Fatalf("got %v %v", m, ok)
	}
	if want := map[string]string{"node": "pve1", "vmid": "100"}; !maps.Equal(p, want) {
		t.Errorf("params %v", p)
	}
}

func TestDecodeForm(t *testing.T) {
	tests := []struct {
		in   string
		want Params
	}{
		{"a=1&b=x+y", Params{"a": "1", "b": "x y"}},
		{"command=%2Fbin%2Fsh&command=-c&command=echo%20hi", Params{"command": []any{"/bin/sh", "-c", "echo hi"}}},
		{"a=1;b=2", Params{"a": "1", "b": "2"}},
		// Perl's split drops the empty value: it is no value.
		{"a=", Params{"a": nil}},
		{"a=b=c", Params{"a": "b"}},
	}
	for _, tt := range tests {
		if got := decodeForm(tt.in); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("decodeForm(%q) = %#v, want %#v", tt.in, got, tt.want)
		}
	}
}

func TestPerlNumber(t *testing.T) {
	for in, want := range map[string]string{"100": "100", "1e2": "100", "1.50": "1.5", "-3": "-3"} {
		if got := perlNumber(in); got != want {
			t.Errorf("perlNumber(%s) = %s, want %s", in, got, want)
		}
	}
}
