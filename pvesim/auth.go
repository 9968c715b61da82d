package pvesim

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"
)

var (
	apiTokenRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?:^|\s)PVEAPIToken(?:=| )([^;]*)`) })
	tokenIDRe  = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^([^\s@!]+@[A-Za-z][A-Za-z0-9.\-_]+)!([A-Za-z][A-Za-z0-9.\-_]+)$`)
	})
	cookieRe   = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?:^|\s|;)PVEAuthCookie=([^;]*)`) })
	templateRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`\{(\w+)\}`) })
)

// splitTokenID splits "user@realm!name".
func splitTokenID(id string) (user, name string, ok bool) {
	m := tokenIDRe().FindStringSubmatch(id)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

// authenticate checks the API token the way pveproxy does: the header
// is found by a regular expression, uri-unescaped, and split at its last
// "="; then pve-access-control's verify_token: the user exists, is
// enabled and not expired, the token exists, has not expired, and the
// secret matches. It returns the token id, which is the caller's identity
// (pve-manager PVE/HTTPServer.pm auth_handler). Tickets (cookies) are not
// simulated and always fail.
func (s *Server) authenticate(r *http.Request) (string, error) {
	fail := httpErr(http.StatusUnauthorized, "Authentication failed!")
	auth := r.Header.Get("Authorization")
	if cookieRe().MatchString(r.Header.Get("Cookie")) || strings.Contains(auth, "PVEAuthCookie") {
		return "", fail
	}
	m := apiTokenRe().FindStringSubmatch(auth)
	if m == nil {
		return "", httpErr(http.StatusUnauthorized, "No ticket")
	}
	raw, err := url.PathUnescape(m[1])
	if err != nil {
		raw = m[1]
	}
	i := strings.LastIndexByte(raw, '=')
	if i < 0 {
		return "", fail
	}
	id, secret := raw[:i], raw[i+1:]
	userid, _, ok := splitTokenID(id)
	if !ok {
		return "", fail
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, tok := s.access.token(id)
	if !s.access.userEnabled(userid) || tok == nil || tok.secret != secret ||
		(tok.expire != 0 && tok.expire < time.Now().Unix()) {
		return "", fail
	}
	return id, nil
}

// checkPermissions is PVE::RPCEnvironment::check_api2_permissions: a
// method's permission object evaluated for the caller. Call with s.mu
// held.
func (s *Server) checkPermissions(perm map[string]any, authid string, params Params) error {
	if authid == "root@pam" {
		return nil
	}
	if perm == nil {
		return permErr("user != root@pam")
	}
	if u, _ := perm["user"].(string); u == "all" || u == "world" {
		return nil
	}
	check, ok := perm["check"].([]any)
	if !ok {
		return permErr("")
	}
	_, err := s.evalCheck(check, authid, params)
	return err
}

// evalCheck is exec_api2_perm_check: ["perm", path, [privs], opts...],
// ["and", ...], ["or", ...], ["userid-param", "self"|"Realm.AllocateUser"],
// ["userid-group", [privs], opts...] and ["perm-modify", path]. It returns
// whether the check passed, and the 403 (or other error) when not.
func (s *Server) evalCheck(check []any, authid string, params Params) (bool, error) {
	uc := s.access
	if len(check) == 0 {
		return false, permErr("")
	}
	str := func(v any) string { return fmt.Sprint(v) }
	opts := func(from int) map[string]string {
		o := map[string]string{}
		for i := from; i+1 < len(check); i += 2 {
			o[str(check[i])] = str(check[i+1])
		}
		return o
	}
	privList := func(v any) []string {
		var out []string
		if l, ok := v.([]any); ok {
			for _, p := range l {
				out = append(out, str(p))
			}
		}
		return out
	}
	param := func(name string) (string, bool) {
		v, ok := params[name]
		if !ok || v == nil {
			return "", false
		}
		return str(v), true
	}
	switch check[0] {
	case "and":
		for _, sub := range check[1:] {
			c, ok := sub.([]any)
			if !ok {
				return false, permErr("")
			}
			if ok, err := s.evalCheck(c, authid, params); !ok {
				return false, err
			}
		}
		return true, nil
	case "or":
		for _, sub := range check[1:] {
			if c, ok := sub.([]any); ok {
				if ok, _ := s.evalCheck(c, authid, params); ok {
					return true, nil
				}
			}
		}
		return false, permErr("")
	case "perm":
		if len(check) < 3 {
			return false, permErr("")
		}
		o := opts(3)
		if rp, ok := o["require_param"]; ok {
			if _, set := param(rp); !set {
				return false, permErr("")
			}
		}
		path := normalizePath(templateReplace(str(check[1]), params))
		privs := privList(check[2])
		var err error
		if truthy(o["any"]) {
			err = uc.checkAny(authid, path, privs...)
		} else {
			err = uc.check(authid, path, privs...)
		}
		return err == nil, err
	case "userid-param":
		if len(check) < 2 {
			return false, permErr("")
		}
		userid, _ := param("userid")
		switch str(check[1]) {
		case "self":
			if uc.users[userid] == nil {
				return false, dieErr("no such user ('%s')", userid)
			}
			if authid == userid {
				return true, nil
			}
			return false, permErr("")
		case "Realm.AllocateUser":
			realm := userid[strings.LastIndexByte(userid, '@')+1:]
			err := uc.check(authid, "/access/realm/"+realm, "Realm.AllocateUser")
			return err == nil, err
		}
		return false, permErr("")
	case "userid-group":
		if len(check) < 2 {
			return false, permErr("")
		}
		privs := privList(check[1])
		o := opts(2)
		userid, _ := param("userid")
		existing := o["groups_param"] != "create"
		if existing && uc.users[userid] == nil {
			return false, dieErr("no such user ('%s')", userid)
		}
		if uc.checkAny(authid, "/access/groups", privs...) == nil {
			return true, nil
		}
		// No groups exist in the simulator: nothing narrower applies.
		if _, ok := o["groups_param"]; ok {
			groups, _ := param("groups")
			if len(splitList(groups)) == 0 {
				return false, permErr("/access/groups, " + strings.Join(privs, "|"))
			}
			return false, permErr("/access/groups/" + splitList(groups)[0] + ", " + strings.Join(privs, "|"))
		}
		return false, permErr("")
	case "perm-modify":
		if len(check) < 2 {
			return false, permErr("")
		}
		path := normalizePath(templateReplace(str(check[1]), params))
		if path == "" {
			return false, permErr("")
		}
		err := uc.checkPermModify(authid, path)
		return err == nil, err
	}
	return false, permErr("")
}

// templateReplace is PVE::Tools::template_replace: {name} from params.
func templateReplace(tpl string, params Params) string {
	return templateRe().ReplaceAllStringFunc(tpl, func(m string) string {
		if v, ok := params[m[1:len(m)-1]]; ok {
			return fmt.Sprint(v)
		}
		return m
	})
}
