package pvesim

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

var (
	apiTokenRe = regexp.MustCompile(`(?:^|\s)PVEAPIToken(?:=| )([^;]*)`)
	tokenIDRe  = regexp.MustCompile(`^([^\s@!]+@[A-Za-z][A-Za-z0-9.\-_]+)!([A-Za-z][A-Za-z0-9.\-_]+)$`)
	cookieRe   = regexp.MustCompile(`(?:^|\s|;)PVEAuthCookie=([^;]*)`)
)

// splitTokenID splits "user@realm!name".
func splitTokenID(id string) (user, name string, ok bool) {
	m := tokenIDRe.FindStringSubmatch(id)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

// authenticate checks the API token the way pveproxy does: the header
// is found by a regular expression, uri-unescaped, and split at its last
// "=". Tickets (cookies) are not simulated and always fail.
func (s *Server) authenticate(r *http.Request) (Token, error) {
	fail := httpErr(http.StatusUnauthorized, "Authentication failed!")
	auth := r.Header.Get("Authorization")
	if cookieRe.MatchString(r.Header.Get("Cookie")) || strings.Contains(auth, "PVEAuthCookie") {
		return Token{}, fail
	}
	m := apiTokenRe.FindStringSubmatch(auth)
	if m == nil {
		return Token{}, httpErr(http.StatusUnauthorized, "No ticket")
	}
	raw, err := url.PathUnescape(m[1])
	if err != nil {
		raw = m[1]
	}
	i := strings.LastIndexByte(raw, '=')
	if i < 0 {
		return Token{}, fail
	}
	id, secret := raw[:i], raw[i+1:]
	s.mu.Lock()
	tok, ok := s.tokens[id]
	s.mu.Unlock()
	if !ok || tok.Secret != secret {
		return Token{}, fail
	}
	return tok, nil
}

func (t Token) has(priv string) bool { return slices.Contains(t.Privileges, priv) }

// checkPermissions evaluates a method's permission object for a token
// (PVE::RPCEnvironment::check_api2_permissions). A token's privileges
// hold on every path.
func checkPermissions(perm map[string]any, tok Token, params Params) error {
	if perm == nil {
		return permErr("")
	}
	if u, _ := perm["user"].(string); u == "all" || u == "world" {
		return nil
	}
	check, ok := perm["check"].([]any)
	if !ok {
		return permErr("")
	}
	return evalCheck(check, tok, params)
}

func permErr(what string) error {
	msg := "Permission check failed"
	if what != "" {
		msg += " (" + what + ")"
	}
	return &apiError{code: http.StatusForbidden, msg: msg + "\n"}
}

// evalCheck runs one check expression: ["perm", path, [privs], opts...],
// ["and", ...] or ["or", ...].
func evalCheck(check []any, tok Token, params Params) error {
	if len(check) == 0 {
		return permErr("")
	}
	switch check[0] {
	case "and":
		for _, sub := range check[1:] {
			if c, ok := sub.([]any); !ok {
				return permErr("")
			} else if err := evalCheck(c, tok, params); err != nil {
				return err
			}
		}
		return nil
	case "or":
		for _, sub := range check[1:] {
			if c, ok := sub.([]any); ok && evalCheck(c, tok, params) == nil {
				return nil
			}
		}
		return permErr("")
	case "perm":
		if len(check) < 3 {
			return permErr("")
		}
		path := templateReplace(fmt.Sprint(check[1]), params)
		var privs []string
		for _, p := range check[2].([]any) {
			privs = append(privs, fmt.Sprint(p))
		}
		anyOf := false
		for i := 3; i+1 < len(check); i += 2 {
			switch check[i] {
			case "any":
				anyOf = truthy(check[i+1])
			case "require_param":
				if _, ok := params[fmt.Sprint(check[i+1])]; !ok {
					return permErr("")
				}
			}
		}
		if anyOf {
			for _, p := range privs {
				if tok.has(p) {
					return nil
				}
			}
			return permErr(path + ", " + strings.Join(privs, "|"))
		}
		for _, p := range privs {
			if !tok.has(p) {
				return permErr(path + ", " + p)
			}
		}
		return nil
	}
	return permErr("")
}

// templateReplace is PVE::Tools::template_replace: {name} from params.
func templateReplace(tpl string, params Params) string {
	return regexp.MustCompile(`\{(\w+)\}`).ReplaceAllStringFunc(tpl, func(m string) string {
		if v, ok := params[m[1:len(m)-1]]; ok {
			return fmt.Sprint(v)
		}
		return m
	})
}
