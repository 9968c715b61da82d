package egress

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"
)

// The proxy keeps what it resolved for a job for as long as the sandbox's
// resolver tells the job to keep its answers (dnsTTL): a job that looked a
// name up, then connects, is connected to an address it was given, and
// the proxy does not ask the network twice. Addresses are checked at each
// use, cached or not. Entries are per job, so that no job can time
// another's lookups.

const maxCached = 10000

type resolveCache struct {
	mu sync.Mutex
	m  map[cacheKey]cached
}

type cacheKey struct {
	token, network, name string // network: ip4 or ip6
}

type cached struct {
	addrs   []netip.Addr
	expires time.Time
}

func (c *resolveCache) get(k cacheKey, now time.Time) ([]netip.Addr, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok || now.After(e.expires) {
		return nil, false
	}
	return e.addrs, true
}

func (c *resolveCache) put(k cacheKey, addrs []netip.Addr, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[cacheKey]cached{}
	}
	if len(c.m) >= maxCached {
		for k, e := range c.m {
			if now.After(e.expires) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= maxCached {
			clear(c.m)
		}
	}
	c.m[k] = cached{addrs: addrs, expires: now.Add(dnsTTL * time.Second)}
}

// outside is how the proxy reaches what a job asked for: names looked up
// for the job (cached per job), connections dialed with the guard's last
// check at connect time.
type outside struct {
	resolver Resolver
	cache    resolveCache
	dialer   net.Dialer
}

// lookup resolves name for token's job: network "ip4" or "ip6" for one
// family (the sandbox's DNS), "ip" for both, IPv4 first (a connection).
func (u *outside) lookup(ctx context.Context, token, network, name string) ([]netip.Addr, error) {
	now := time.Now()
	if network != "ip" {
		k := cacheKey{token, network, name}
		if addrs, ok := u.cache.get(k, now); ok {
			return addrs, nil
		}
		addrs, err := u.resolver.LookupNetIP(ctx, network, name)
		if err == nil {
			u.cache.put(k, addrs, now)
		}
		return addrs, err
	}
	k4, k6 := cacheKey{token, "ip4", name}, cacheKey{token, "ip6", name}
	if v4, ok := u.cache.get(k4, now); ok && len(v4) > 0 {
		v6, _ := u.cache.get(k6, now)
		return append(append([]netip.Addr(nil), v4...), v6...), nil
	}
	addrs, err := u.resolver.LookupNetIP(ctx, "ip", name)
	if err != nil {
		return nil, err
	}
	var v4, v6 []netip.Addr
	for _, a := range addrs {
		if a = a.Unmap(); a.Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a)
		}
	}
	u.cache.put(k4, v4, now)
	u.cache.put(k6, v6, now)
	return append(v4, v6...), nil
}
