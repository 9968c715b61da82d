package pvesim

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// The access API: what an administrator uses to make a least-privilege
// API token (pve-access-control src/PVE/API2/{Role,User,ACL,
// AccessControl}.pm). The method's permission check (the schema's) has
// passed when a handler runs; what the code checks besides is here, with
// Proxmox's messages. Errors raised while user.cfg is locked read
// "<what> failed: <error>" (AccessControl.pm lock_user_config).

// lockedErr is a failure inside lock_user_config: a 500 whose message is
// errmsg and the error, a parameter error stringified as PVE::Exception
// does ("400 Parameter verification failed.\nrole: ...").
func lockedErr(errmsg string, err error) error {
	if pe, ok := err.(*ParamError); ok {
		var b strings.Builder
		b.WriteString("400 Parameter verification failed.\n")
		for _, k := range slices.Sorted(maps.Keys(pe.Errors)) {
			fmt.Fprintf(&b, "%s: %s\n", k, pe.Errors[k])
		}
		return &apiError{code: 500, msg: errmsg + ": " + b.String()}
	}
	msg := strings.TrimSuffix(err.Error(), "\n")
	if ae, ok := err.(*apiError); ok {
		msg = strings.TrimSuffix(ae.msg, "\n")
	}
	return dieErr("%s: %s", errmsg, msg)
}

// GET /access/roles
func hRoles(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []map[string]any{}
	for _, r := range slices.Sorted(maps.Keys(s.access.roles)) {
		out = append(out, map[string]any{"roleid": r, "privs": strings.Join(slices.Sorted(maps.Keys(s.access.roles[r])), ","),
			"special": b2i(s.access.special[r])})
	}
	return out, nil
}

// GET /access/roles/{roleid}: each privilege as a key set to 1.
func hRole(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	privs, ok := s.access.roles[c.str("roleid")]
	if !ok {
		return nil, dieErr("role '%s' does not exist", c.str("roleid"))
	}
	out := map[string]any{}
	for p := range privs {
		out[p] = 1
	}
	return out, nil
}

// setRolePrivs is add_role_privs.
func (uc *userConfig) setRolePrivs(role, privs string) error {
	for _, p := range splitList(privs) {
		if !validPrivileges(uc.major)[p] {
			return fmt.Errorf("invalid privilege '%s'", p)
		}
		uc.roles[role][p] = true
	}
	return nil
}

// POST /access/roles: a role outside the "PVE" namespace.
func hCreateRole(c *call) (any, error) {
	s := c.s
	role := c.str("roleid")
	if strings.HasPrefix(strings.ToLower(role), "pve") {
		return nil, paramErr("roleid", "cannot use role ID starting with the (case-insensitive) 'PVE' namespace")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	uc := s.access
	if uc.roles[role] != nil {
		return nil, lockedErr("create role failed", fmt.Errorf("role '%s' already exists", role))
	}
	uc.roles[role] = map[string]bool{}
	if err := uc.setRolePrivs(role, c.str("privs")); err != nil {
		delete(uc.roles, role)
		return nil, lockedErr("create role failed", err)
	}
	return nil, nil
}

// PUT /access/roles/{roleid}: replace (or with append add to) the
// privileges of a role that is not built in.
func hUpdateRole(c *call) (any, error) {
	s := c.s
	role := c.str("roleid")
	s.mu.Lock()
	defer s.mu.Unlock()
	uc := s.access
	if uc.special[role] {
		return nil, dieErr("auto-generated role '%s' cannot be modified", role)
	}
	if uc.roles[role] == nil {
		return nil, lockedErr("update role failed", fmt.Errorf("role '%s' does not exist", role))
	}
	old := maps.Clone(uc.roles[role])
	if !c.boolOr("append", false) {
		uc.roles[role] = map[string]bool{}
	}
	if err := uc.setRolePrivs(role, c.str("privs")); err != nil {
		uc.roles[role] = old
		return nil, lockedErr("update role failed", err)
	}
	return nil, nil
}

// DELETE /access/roles/{roleid}: ACLs naming it stay, and give nothing.
func hDeleteRole(c *call) (any, error) {
	s := c.s
	role := c.str("roleid")
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.access.special[role] {
		return nil, dieErr("auto-generated role '%s' cannot be deleted", role)
	}
	if s.access.roles[role] == nil {
		return nil, lockedErr("delete role failed", fmt.Errorf("role '%s' does not exist", role))
	}
	delete(s.access.roles, role)
	return nil, nil
}

// userData is User.pm's $extract_user_data.
func userData(u *simUser, full bool) map[string]any {
	out := map[string]any{"enable": b2i(u.enable)}
	if u.expire != 0 {
		out["expire"] = u.expire
	}
	for k, v := range map[string]string{"firstname": u.firstname, "lastname": u.lastname, "email": u.email, "comment": u.comment} {
		if v != "" {
			out[k] = v
		}
	}
	if full {
		out["groups"] = []any{}
		tokens := []any{}
		for _, name := range slices.Sorted(maps.Keys(u.tokens)) {
			tokens = append(tokens, tokenInfo(name, u.tokens[name]))
		}
		out["tokens"] = tokens
	}
	return out
}

func tokenInfo(name string, t *simToken) map[string]any {
	out := map[string]any{"privsep": b2i(t.privsep)}
	if t.expire != 0 {
		out["expire"] = t.expire
	}
	if name != "" {
		out["tokenid"] = name
	}
	if t.comment != "" {
		out["comment"] = t.comment
	}
	return out
}

// GET /access/users: the users the caller may see (User.Modify or
// Sys.Audit on /access/groups), and always itself.
func hUsers(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	uc := s.access
	canMod := uc.checkAny(c.authid, "/access/groups", "User.Modify", "Sys.Audit") == nil
	out := []map[string]any{}
	for _, id := range slices.Sorted(maps.Keys(uc.users)) {
		if !canMod && id != c.authid {
			continue
		}
		u := uc.users[id]
		if c.has("enabled") && c.boolOr("enabled", false) != u.enable {
			continue
		}
		e := userData(u, c.boolOr("full", false))
		e["userid"] = id
		realm := id[strings.LastIndexByte(id, '@')+1:]
		if realm == "pam" || realm == "pve" {
			e["realm-type"] = realm
		}
		out = append(out, e)
	}
	return out, nil
}

// GET /access/users/{userid}
func hUser(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.access.users[c.str("userid")]
	if u == nil {
		return nil, dieErr("no such user ('%s')", c.str("userid"))
	}
	return userData(u, true), nil
}

// POST /access/users
func hCreateUser(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	uc := s.access
	id := c.str("userid")
	if uc.users[id] != nil {
		return nil, lockedErr("create user failed", fmt.Errorf("user '%s' already exists", id))
	}
	if groups := splitList(c.str("groups")); len(groups) > 0 {
		return nil, lockedErr("create user failed", fmt.Errorf("no such group '%s'", groups[0]))
	}
	uc.users[id] = &simUser{enable: c.boolOr("enable", true), expire: int64(c.intOr("expire", 0)),
		comment: c.str("comment"), email: c.str("email"), firstname: c.str("firstname"), lastname: c.str("lastname"),
		tokens: map[string]*simToken{}}
	return nil, nil
}

// DELETE /access/users/{userid}: with its tokens and ACL entries.
func hDeleteUser(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	id := c.str("userid")
	if s.access.users[id] == nil {
		return nil, lockedErr("delete user failed", fmt.Errorf("no such user ('%s')", id))
	}
	s.access.dropUser(id)
	return nil, nil
}

// GET /access/users/{userid}/token
func hTokens(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.access.users[c.str("userid")]
	if u == nil {
		return nil, dieErr("no such user ('%s')", c.str("userid"))
	}
	out := []map[string]any{}
	for _, name := range slices.Sorted(maps.Keys(u.tokens)) {
		out = append(out, tokenInfo(name, u.tokens[name]))
	}
	return out, nil
}

// GET /access/users/{userid}/token/{tokenid}
func hToken(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	tok, err := s.access.tokenOf(c.str("userid"), c.str("tokenid"))
	if err != nil {
		return nil, err
	}
	return tokenInfo("", tok), nil
}

// tokenOf is check_token_exist.
func (uc *userConfig) tokenOf(userid, name string) (*simToken, error) {
	u := uc.users[userid]
	if u == nil {
		return nil, dieErr("no such user ('%s')", userid)
	}
	tok := u.tokens[name]
	if tok == nil {
		return nil, dieErr("no such token '%s' for user '%s'", name, userid)
	}
	return tok, nil
}

// POST /access/users/{userid}/token/{tokenid}: a new token, privilege-
// separated unless privsep=0; the answer carries its secret ("value", a
// UUID, shown this once) and "full-tokenid".
func hCreateToken(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	userid, name := c.str("userid"), c.str("tokenid")
	u := s.access.users[userid]
	if u == nil {
		return nil, dieErr("no such user ('%s')", userid)
	}
	if u.tokens[name] != nil {
		return nil, paramErr("tokenid", "Token already exists.")
	}
	tok := &simToken{privsep: c.boolOr("privsep", true), expire: int64(c.intOr("expire", 0)),
		comment: c.str("comment"), secret: uuid()}
	u.tokens[name] = tok
	return map[string]any{"info": tokenInfo("", tok), "value": tok.secret, "full-tokenid": userid + "!" + name}, nil
}

// DELETE /access/users/{userid}/token/{tokenid}
func hDeleteToken(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	userid, name := c.str("userid"), c.str("tokenid")
	if _, err := s.access.tokenOf(userid, name); err != nil {
		return nil, err
	}
	s.access.dropToken(userid + "!" + name)
	return nil, nil
}

// GET /access/acl: the entries on paths where the caller may change
// permissions (or all, with Sys.Audit on /access).
func hACL(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	uc := s.access
	audit := uc.check(c.authid, "/access", "Sys.Audit") == nil
	return uc.aclEntries(func(path string) bool {
		return audit || uc.checkPermModify(c.authid, path) == nil
	}), nil
}

// PUT /access/acl: grant (or with delete remove) roles on a path to
// users and tokens. Without Permissions.Modify on the path, a caller may
// only hand out privileges it holds there itself (propagated, to
// propagate them), and never NoAccess.
func hUpdateACL(c *call) (any, error) {
	s := c.s
	if !c.has("users") && !c.has("groups") && !c.has("tokens") {
		msg := "either 'users', 'groups' or 'tokens' is required."
		return nil, &ParamError{Errors: map[string]string{"users": msg, "groups": msg, "tokens": msg}}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	uc := s.access
	raw := c.str("path")
	path := normalizePath(raw)
	if path == "" || (!c.boolOr("delete", false) && !aclPathRe(uc.major).MatchString(path)) {
		return nil, paramErr("path", fmt.Sprintf("invalid ACL path '%s'", raw))
	}
	del := c.boolOr("delete", false)
	propagate := c.boolOr("propagate", true)
	mine := uc.privileges(c.authid, path)
	_, canModify := mine["Permissions.Modify"]
	fail := func(err error) error { return lockedErr("ACL update failed", err) }
	// Check everything first: user.cfg is written only when all is well.
	type grant struct {
		role, id string
		token    bool
	}
	var grants []grant
	for _, role := range splitList(c.str("roles")) {
		if uc.roles[role] == nil {
			return nil, fail(fmt.Errorf("role '%s' does not exist", role))
		}
		if !canModify {
			verb := "add"
			if del {
				verb = "remove"
			}
			for _, p := range slices.Sorted(maps.Keys(uc.roles[role])) {
				have, ok := mine[p]
				if !ok {
					return nil, fail(paramErr("role", fmt.Sprintf("Cannot %s role '%s' - requires 'Permissions.Modify' or superset of privileges.", verb, role)))
				}
				if propagate && !have && !del {
					return nil, fail(paramErr("role", fmt.Sprintf("Cannot %s role '%s' with propagation - requires 'Permissions.Modify' or propagated superset of privileges.", verb, role)))
				}
			}
			if role == "NoAccess" {
				return nil, fail(paramErr("role", fmt.Sprintf("Cannot %s role '%s' - requires 'Permissions.Modify'", verb, role)))
			}
		}
		if groups := splitList(c.str("groups")); len(groups) > 0 {
			return nil, fail(fmt.Errorf("group '%s' does not exist", groups[0]))
		}
		for _, u := range splitList(c.str("users")) {
			if uc.users[u] == nil {
				return nil, fail(fmt.Errorf("user '%s' does not exist", u))
			}
			grants = append(grants, grant{role, u, false})
		}
		for _, t := range splitList(c.str("tokens")) {
			user, name, _ := splitTokenID(t)
			if _, err := uc.tokenOf(user, name); err != nil {
				return nil, fail(err)
			}
			grants = append(grants, grant{role, t, true})
		}
	}
	for _, g := range grants {
		if !del {
			uc.grant(path, g.role, g.id, g.token, propagate)
			continue
		}
		n := uc.node(path)
		entries := n.users
		if g.token {
			entries = n.tokens
		}
		delete(entries[g.id], g.role)
	}
	return nil, nil
}

// GET /access/permissions: the caller's (or, with Sys.Audit on /access,
// anyone's; a user may also ask for its own tokens') privileges on a path,
// or on every path that matters (get_effective_permissions).
func hPermissions(c *call) (any, error) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	uc := s.access
	who := c.authid
	if c.has("userid") {
		who = c.str("userid")
	}
	owner, _, _ := splitTokenID(who)
	if who != c.authid && owner != c.authid {
		if err := uc.check(c.authid, "/access", "Sys.Audit"); err != nil {
			return nil, err
		}
	}
	render := func(privs map[string]bool) map[string]any {
		out := map[string]any{}
		for p, prop := range privs {
			out[p] = b2i(prop)
		}
		return out
	}
	if path := c.str("path"); path != "" {
		return map[string]any{path: render(uc.privileges(who, path))}, nil
	}
	paths := []string{"/", "/access", "/access/groups", "/nodes", "/pool", "/sdn", "/storage", "/vms"}
	paths = append(paths, uc.aclPaths()...)
	for _, p := range uc.pools {
		for id := range p.vms {
			paths = append(paths, fmt.Sprintf("/vms/%d", id))
		}
	}
	out := map[string]any{}
	for _, p := range paths {
		if privs := uc.privileges(who, p); len(privs) > 0 {
			out[p] = render(privs)
		}
	}
	return out, nil
}
