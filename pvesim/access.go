package pvesim

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// userConfig is PVE's user.cfg: users and their API tokens, roles, the
// ACL tree and pools (pve-access-control src/PVE/AccessControl.pm). Only
// API tokens authenticate; users exist to own tokens and to hold ACLs.
// Groups are not simulated (there are none). Call its methods with s.mu
// held.
type userConfig struct {
	major int // the release: its privileges and built-in roles
	users map[string]*simUser
	// roles maps a role to its privileges; the built-in ones are special
	// (they cannot be changed or deleted).
	roles   map[string]map[string]bool
	special map[string]bool
	acl     *aclNode
	pools   map[string]*simPool
}

type simUser struct {
	enable                              bool
	expire                              int64 // unix seconds, 0: never
	comment, email, firstname, lastname string
	tokens                              map[string]*simToken
}

type simToken struct {
	privsep bool
	expire  int64
	comment string
	secret  string // PVE keeps a hash in priv/token.cfg; the simulator keeps it
}

type simPool struct {
	vms map[int]bool
}

// aclNode is one path element of the ACL tree: the roles each user and
// token has there, with their propagate flag.
type aclNode struct {
	children      map[string]*aclNode
	users, tokens map[string]map[string]bool
}

func newUserConfig(major int) *userConfig {
	uc := &userConfig{
		major:   major,
		users:   map[string]*simUser{"root@pam": {enable: true, tokens: map[string]*simToken{}}},
		roles:   builtinRoles(major),
		special: map[string]bool{},
		acl:     &aclNode{},
		pools:   map[string]*simPool{},
	}
	for r := range uc.roles {
		uc.special[r] = true
	}
	return uc
}

// node returns the ACL tree node of a normalized path, creating it.
func (uc *userConfig) node(path string) *aclNode {
	n := uc.acl
	for _, p := range strings.Split(strings.Trim(path, "/"), "/") {
		if p == "" {
			continue
		}
		if n.children == nil {
			n.children = map[string]*aclNode{}
		}
		if n.children[p] == nil {
			n.children[p] = &aclNode{}
		}
		n = n.children[p]
	}
	return n
}

// grant adds an ACL entry (PUT /access/acl without delete).
func (uc *userConfig) grant(path, role, ugid string, token, propagate bool) {
	n := uc.node(path)
	m := &n.users
	if token {
		m = &n.tokens
	}
	if *m == nil {
		*m = map[string]map[string]bool{}
	}
	if (*m)[ugid] == nil {
		(*m)[ugid] = map[string]bool{}
	}
	(*m)[ugid][role] = propagate
}

// userEnabled is check_user_enabled: the user exists, is enabled and has
// not expired.
func (uc *userConfig) userEnabled(userid string) bool {
	u := uc.users[userid]
	return u != nil && u.enable && (u.expire == 0 || u.expire > time.Now().Unix())
}

// token finds an API token by its full id.
func (uc *userConfig) token(tokenid string) (*simUser, *simToken) {
	user, name, ok := splitTokenID(tokenid)
	if !ok {
		return nil, nil
	}
	u := uc.users[user]
	if u == nil {
		return nil, nil
	}
	return u, u.tokens[name]
}

// rolesAt is AccessControl.pm's roles(): walking the path from the root,
// a token's, else a user's entries replace what was inherited; an entry
// applies on its own node and, when it propagates, below. NoAccess wins.
// Values are the propagate flags.
func (uc *userConfig) rolesAt(authid, path string) map[string]bool {
	isToken := strings.Contains(authid, "!")
	roles := map[string]bool{}
	n := uc.acl
	parts := []string{""}
	if path != "/" {
		parts = append(parts, strings.Split(strings.Trim(path, "/"), "/")...)
	}
	for i, p := range parts {
		if p != "" {
			if n = n.children[p]; n == nil {
				break
			}
		}
		final := i == len(parts)-1
		entries := n.users
		if isToken {
			entries = n.tokens
		}
		if ri := entries[authid]; len(ri) > 0 {
			var next map[string]bool
			for role, propagate := range ri {
				if final || propagate {
					if next == nil {
						next = map[string]bool{}
					}
					next[role] = propagate
				}
			}
			if next != nil {
				roles = next
			}
		}
	}
	if p, ok := roles["NoAccess"]; ok {
		return map[string]bool{"NoAccess": p}
	}
	return roles
}

// privileges is PVE::RPCEnvironment::permissions: the privileges authid
// (a user or a user@realm!token) has on path, with the propagate flag of
// the role that gives each. root@pam has everything; a token without
// privilege separation has its user's rights; a privilege-separated one
// has what its own ACLs give it, intersected with its user's (except for
// root@pam's tokens). Roles of a pool apply to the VMs in it.
func (uc *userConfig) privileges(authid, path string) map[string]bool {
	all := func() map[string]bool {
		out := map[string]bool{}
		for p := range uc.roles["Administrator"] {
			out[p] = true
		}
		return out
	}
	if authid == "root@pam" {
		return all()
	}
	userid := authid
	if strings.Contains(authid, "!") {
		u, tok := uc.token(authid)
		if u == nil || tok == nil {
			return map[string]bool{}
		}
		userid, _, _ = splitTokenID(authid)
		userPrivs := uc.privileges(userid, path)
		if !tok.privsep {
			return userPrivs
		}
		privs := uc.compile(authid, path)
		if userid == "root@pam" {
			return privs
		}
		out := map[string]bool{}
		for p, prop := range privs {
			if up, ok := userPrivs[p]; ok {
				out[p] = prop && up
			}
		}
		return out
	}
	if uc.users[userid] == nil {
		return map[string]bool{}
	}
	return uc.compile(authid, path)
}

// compile is RPCEnvironment.pm's $compile_acl_path: the roles on the path
// (and those of a pool holding the VM, which never override NoAccess and
// never propagate) turned into privileges.
func (uc *userConfig) compile(authid, path string) map[string]bool {
	roles := uc.rolesAt(authid, path)
	if _, denied := roles["NoAccess"]; !denied {
		var vmid int
		if _, err := fmt.Sscanf(path, "/vms/%d", &vmid); err == nil && fmt.Sprintf("/vms/%d", vmid) == path {
			for name, pool := range uc.pools {
				if !pool.vms[vmid] {
					continue
				}
				poolRoles := uc.rolesAt(authid, "/pool/"+name)
				if _, ok := poolRoles["NoAccess"]; ok {
					roles = map[string]bool{"NoAccess": false}
					break
				}
				for r := range poolRoles {
					if _, set := roles[r]; !set {
						roles[r] = false
					}
				}
			}
		}
	}
	privs := map[string]bool{}
	for role, prop := range roles {
		for p := range uc.roles[role] {
			privs[p] = privs[p] || prop
		}
	}
	return privs
}

// permErr is PVE::Exception::raise_perm_exc: 403 "Permission check failed
// (what)".
func permErr(what string) error {
	msg := "Permission check failed"
	if what != "" {
		msg += " (" + what + ")"
	}
	return &apiError{code: 403, msg: msg + "\n"}
}

// check is $rpcenv->check: every privilege on path, or 403 naming the
// first one missing.
func (uc *userConfig) check(authid, path string, privs ...string) error {
	have := uc.privileges(authid, path)
	for _, p := range privs {
		if _, ok := have[p]; !ok {
			return permErr(path + ", " + p)
		}
	}
	return nil
}

// checkAny is $rpcenv->check_any: one of the privileges on path, or 403
// naming them all.
func (uc *userConfig) checkAny(authid, path string, privs ...string) error {
	have := uc.privileges(authid, path)
	for _, p := range privs {
		if _, ok := have[p]; ok {
			return nil
		}
	}
	return permErr(path + ", " + strings.Join(privs, "|"))
}

// checkPermModify is $rpcenv->check_perm_modify: who may change ACLs on a
// path (Permissions.Modify, or the allocate privilege of the object).
func (uc *userConfig) checkPermModify(authid, path string) error {
	privs := []string{"Permissions.Modify"}
	switch {
	case strings.HasPrefix(path, "/storage/") && len(path) > len("/storage/"):
		privs = append(privs, "Datastore.Allocate")
	case strings.HasPrefix(path, "/vms/") && len(path) > len("/vms/"):
		privs = append(privs, "VM.Allocate")
	case strings.HasPrefix(path, "/pool/") && len(path) > len("/pool/"):
		privs = append(privs, "Pool.Allocate")
	}
	return uc.checkAny(authid, path, privs...)
}

// normalizePath is AccessControl.pm's normalize_path; "" when invalid.
func normalizePath(path string) string {
	if path == "" {
		return ""
	}
	path = slashesRe().ReplaceAllString(path, "/")
	path = strings.TrimSuffix(path, "/")
	if path == "" {
		path = "/"
	}
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	if !aclCharsRe().MatchString(path) {
		return ""
	}
	return path
}

var (
	slashesRe  = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`/+`) })
	aclCharsRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[[:alnum:]._\-/]+$`) })
)

// aclPathRe is AccessControl.pm's check_path: the paths an ACL may be set
// on. PVE 9 adds /sdn/fabrics, /sdn/prefix-lists and /sdn/route-maps.
func aclPathRe(major int) *regexp.Regexp {
	sdn9 := ""
	if major >= 9 {
		sdn9 = `|/sdn/fabrics|/sdn/fabrics/[[:alnum:]]+|/sdn/prefix-lists|/sdn/prefix-lists/[[:alnum:]]+|/sdn/route-maps|/sdn/route-maps/[[:alnum:]]+`
	}
	return regexp.MustCompile(`^(/|/access|/access/groups|/access/groups/[[:alnum:]._\-]+|/access/realm|/access/realm/[[:alnum:]._\-]+` +
		`|/nodes|/nodes/[[:alnum:]._\-]+|/pool|/pool/[A-Za-z0-9._\-]+(?:/[A-Za-z0-9._\-]+){0,2}` +
		`|/sdn|/sdn/controllers|/sdn/controllers/[[:alnum:]_\-]+|/sdn/dns|/sdn/dns/[[:alnum:]]+` + sdn9 +
		`|/sdn/ipams|/sdn/ipams/[[:alnum:]]+|/sdn/zones|/sdn/zones/[[:alnum:]._\-]+` +
		`|/sdn/zones/[[:alnum:]._\-]+/[[:alnum:]._\-]+|/sdn/zones/[[:alnum:]._\-]+/[[:alnum:]._\-]+/[1-9][0-9]{0,3}` +
		`|/storage|/storage/[[:alnum:]._\-]+|/vms|/vms/[1-9][0-9]{2,}` +
		`|/mapping|/mapping/[[:alnum:]._\-]+|/mapping/[[:alnum:]._\-]+/[[:alnum:]._\-]+)$`)
}

// aclEntries lists the ACL tree as GET /access/acl does: path, type
// (user, group, token), ugid, roleid, propagate.
func (uc *userConfig) aclEntries(visible func(path string) bool) []map[string]any {
	out := []map[string]any{}
	var walk func(path string, n *aclNode)
	walk = func(path string, n *aclNode) {
		if visible(path) {
			for _, kind := range []struct {
				typ     string
				entries map[string]map[string]bool
			}{{"user", n.users}, {"token", n.tokens}} {
				for _, id := range slices.Sorted(maps.Keys(kind.entries)) {
					for _, role := range slices.Sorted(maps.Keys(kind.entries[id])) {
						out = append(out, map[string]any{"path": path, "type": kind.typ, "ugid": id,
							"roleid": role, "propagate": b2i(kind.entries[id][role])})
					}
				}
			}
		}
		for _, name := range slices.Sorted(maps.Keys(n.children)) {
			child := path + "/" + name
			if path == "/" {
				child = "/" + name
			}
			walk(child, n.children[name])
		}
	}
	walk("/", uc.acl)
	return out
}

// aclPaths lists the paths with ACL entries (iterate_acl_tree).
func (uc *userConfig) aclPaths() []string {
	var out []string
	for _, e := range uc.aclEntries(func(string) bool { return true }) {
		if p := e["path"].(string); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// dropUser removes a user, its tokens and their ACL entries.
func (uc *userConfig) dropUser(userid string) {
	delete(uc.users, userid)
	var walk func(n *aclNode)
	walk = func(n *aclNode) {
		delete(n.users, userid)
		for id := range n.tokens {
			if u, _, _ := splitTokenID(id); u == userid {
				delete(n.tokens, id)
			}
		}
		for _, c := range n.children {
			walk(c)
		}
	}
	walk(uc.acl)
}

// dropToken removes a token and its ACL entries.
func (uc *userConfig) dropToken(tokenid string) {
	if u, tok := uc.token(tokenid); tok != nil {
		_, name, _ := splitTokenID(tokenid)
		delete(u.tokens, name)
	}
	var walk func(n *aclNode)
	walk = func(n *aclNode) {
		delete(n.tokens, tokenid)
		for _, c := range n.children {
			walk(c)
		}
	}
	walk(uc.acl)
}

// dropVM is remove_vm_access: a destroyed VM's ACLs and pool membership go.
func (uc *userConfig) dropVM(vmid int) {
	if vms := uc.acl.children["vms"]; vms != nil {
		delete(vms.children, fmt.Sprint(vmid))
	}
	for _, p := range uc.pools {
		delete(p.vms, vmid)
	}
}
