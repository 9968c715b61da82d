package pvesim

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// JobToken is a least-privilege API token made for delegate's jobs.
type JobToken struct {
	// User, TokenName and Secret are PROXMOX_USER, PROXMOX_TOKEN_NAME
	// and PROXMOX_TOKEN_VALUE.
	User, TokenName, Secret string
	// Role is granted to the user and to the token on each of Paths.
	Role       string
	Privileges []string
	Paths      []string
}

// CreateJobToken makes, through the simulator's own access API and as an
// administrator would (admin is a token allowed to: Sys.Modify on
// /access, User.Modify, Realm.AllocateUser, Permissions.Modify), the
// token the documentation describes (PveumCommands): the role
// DelegateJobs with JobRolePrivileges of the simulator's release, the
// user delegate@pve, its privilege-separated token "jobs", and the role on
// /vms, /nodes, every storage that holds VM images and the bridge vmbr0,
// for the user and for the token (a privilege-separated token has only
// what both have).
func (s *Server) CreateJobToken(ctx context.Context, admin Token) (JobToken, error) {
	jt := JobToken{User: "delegate@pve", TokenName: "jobs", Role: JobRoleName,
		Privileges: JobRolePrivileges(s.rel.name)}
	var storages []string
	s.mu.Lock()
	for _, st := range s.storages {
		if st.hasContent("images") {
			storages = append(storages, st.id)
		}
	}
	s.mu.Unlock()
	jt.Paths = JobACLPaths(storages, []string{"vmbr0"})
	api := newAPIClient(s, admin)
	if err := api.call(ctx, "POST", "/access/roles", url.Values{
		"roleid": {jt.Role}, "privs": {strings.Join(jt.Privileges, ",")}}, nil); err != nil {
		return JobToken{}, err
	}
	if err := api.call(ctx, "POST", "/access/users", url.Values{"userid": {jt.User}}, nil); err != nil {
		return JobToken{}, err
	}
	var tok struct {
		Value       string `json:"value"`
		FullTokenID string `json:"full-tokenid"`
	}
	if err := api.call(ctx, "POST", "/access/users/"+url.PathEscape(jt.User)+"/token/"+jt.TokenName,
		url.Values{"privsep": {"1"}}, &tok); err != nil {
		return JobToken{}, err
	}
	jt.Secret = tok.Value
	for _, p := range jt.Paths {
		if err := api.call(ctx, "PUT", "/access/acl", url.Values{"path": {p}, "roles": {jt.Role},
			"users": {jt.User}, "tokens": {tok.FullTokenID}}, nil); err != nil {
			return JobToken{}, err
		}
	}
	return jt, nil
}

// CreatePoolJobToken is CreateJobToken for VMs in a resource pool (which
// must exist: Options.Pools): the job role on /pool/<pool> instead of
// /vms, and PVETemplateUser on each template, so that the token reaches
// no other VM of the cluster (PveumPoolCommands).
func (s *Server) CreatePoolJobToken(ctx context.Context, admin Token, pool string, templates []int) (JobToken, error) {
	jt := JobToken{User: "delegate@pve", TokenName: "jobs", Role: JobRoleName,
		Privileges: JobRolePrivileges(s.rel.name)}
	var storages []string
	s.mu.Lock()
	for _, st := range s.storages {
		if st.hasContent("images") {
			storages = append(storages, st.id)
		}
	}
	s.mu.Unlock()
	jt.Paths = JobPoolACLPaths(pool, storages, []string{"vmbr0"})
	api := newAPIClient(s, admin)
	if err := api.call(ctx, "POST", "/access/roles", url.Values{
		"roleid": {jt.Role}, "privs": {strings.Join(jt.Privileges, ",")}}, nil); err != nil {
		return JobToken{}, err
	}
	if err := api.call(ctx, "POST", "/access/users", url.Values{"userid": {jt.User}}, nil); err != nil {
		return JobToken{}, err
	}
	var tok struct {
		Value       string `json:"value"`
		FullTokenID string `json:"full-tokenid"`
	}
	if err := api.call(ctx, "POST", "/access/users/"+url.PathEscape(jt.User)+"/token/"+jt.TokenName,
		url.Values{"privsep": {"1"}}, &tok); err != nil {
		return JobToken{}, err
	}
	jt.Secret = tok.Value
	grant := func(path, role string) error {
		return api.call(ctx, "PUT", "/access/acl", url.Values{"path": {path}, "roles": {role},
			"users": {jt.User}, "tokens": {tok.FullTokenID}}, nil)
	}
	for _, p := range jt.Paths {
		if err := grant(p, jt.Role); err != nil {
			return JobToken{}, err
		}
	}
	for _, t := range templates {
		p := "/vms/" + strconv.Itoa(t)
		if err := grant(p, "PVETemplateUser"); err != nil {
			return JobToken{}, err
		}
		jt.Paths = append(jt.Paths, p)
	}
	return jt, nil
}

// apiClient calls the simulator's API over HTTPS, pinned to its
// certificate: a minimal client of its own, so the simulator does not
// depend on the client it is there to test.
type apiClient struct {
	base, auth string
	http       *http.Client
}

func newAPIClient(s *Server, tok Token) *apiClient {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.certPEM)
	return &apiClient{
		base: s.URL() + "/api2/json",
		auth: "PVEAPIToken=" + tok.ID + "=" + tok.Secret,
		http: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}}},
	}
}

// call sends a form-encoded request and decodes the envelope's data.
func (a *apiClient) call(ctx context.Context, method, path string, form url.Values, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", a.auth)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := a.http.Do(req)
	if err != nil {
		return fmt.Errorf("pvesim: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		var env struct {
			Errors map[string]string `json:"errors"`
		}
		json.Unmarshal(body, &env)
		return fmt.Errorf("pvesim: %s %s: %s %v", method, path, resp.Status, env.Errors)
	}
	if out == nil {
		return nil
	}
	var env struct {
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("pvesim: %s %s: %w", method, path, err)
	}
	return json.Unmarshal(env.Data, out)
}
