package egress

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// dnsTTL is the lifetime of every answer: short, so that a widened
// allowlist, or a name whose addresses change, is seen soon.
const dnsTTL = 30

// ServeDNS answers the DNS queries of token's sandbox on pc (UDP): A and
// AAAA records for the names its policy allows, with only the addresses it
// may reach, and NXDOMAIN for the others. It resolves through
// Config.Resolver and forwards nothing: no query of the job's leaves the
// host as the job wrote it. Replies leave from the address each query was
// sent to, so that pc may be bound to a wildcard address (0.0.0.0:53)
// that catches queries to any resolver.
func (p *Proxy) ServeDNS(ctx context.Context, pc net.PacketConn, token string) error {
	if token == "" {
		return fmt.Errorf("%w: a DNS listener belongs to one job: give its token", ErrInvalid)
	}
	return p.serveDNS(ctx, &dns.Server{PacketConn: pc}, token)
}

// ServeDNSStream is ServeDNS over TCP, for answers too long for UDP and
// clients that start with TCP.
func (p *Proxy) ServeDNSStream(ctx context.Context, ln net.Listener, token string) error {
	if token == "" {
		return fmt.Errorf("%w: a DNS listener belongs to one job: give its token", ErrInvalid)
	}
	return p.serveDNS(ctx, &dns.Server{Listener: &limitedListener{Listener: ln, p: p, token: token, via: ViaDNS}}, token)
}

func (p *Proxy) serveDNS(ctx context.Context, srv *dns.Server, token string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv.Handler = dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := p.answer(withClient(ctx, w.RemoteAddr()), token, q)
		w.WriteMsg(m)
	})
	srv.MsgAcceptFunc = acceptQuery
	errc := make(chan error, 1)
	go func() { errc <- srv.ActivateAndServe() }()
	select {
	case err := <-errc:
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("egress: dns: %w", err)
	case <-ctx.Done():
	case <-p.closed:
	}
	srv.Shutdown()
	<-errc
	return nil
}

// acceptQuery takes standard queries with one question; everything else
// sent to the port is dropped or refused, never forwarded.
func acceptQuery(h dns.Header) dns.MsgAcceptAction {
	if h.Bits&(1<<15) != 0 { // a response, not a query
		return dns.MsgIgnore
	}
	if opcode := int(h.Bits>>11) & 0xF; opcode != dns.OpcodeQuery {
		return dns.MsgRejectNotImplemented
	}
	if h.Qdcount != 1 || h.Ancount != 0 || h.Nscount != 0 || h.Arcount > 2 {
		return dns.MsgReject
	}
	return dns.MsgAccept
}

// answer decides one query and logs it.
func (p *Proxy) answer(ctx context.Context, token string, q *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(q)
	m.RecursionAvailable = true
	qs := q.Question[0]
	a := &attempt{token: token, via: ViaDNS, start: time.Now()}
	e := a.entry()
	e.Port = 53
	e.Sent = int64(q.Len())
	defer func() {
		e.Received = int64(m.Len())
		e.Duration = time.Since(e.Time)
		p.record(token, e)
	}()
	e.Name = strings.TrimSuffix(qs.Name, ".")
	name, reason := normalizeName(e.Name)
	if reason != "" || qs.Qclass != dns.ClassINET {
		e.Rule = cmp.Or(reason, "not class IN")
		m.Rcode = dns.RcodeRefused
		return m
	}
	a.name, e.Name = name, name
	e.QType = dns.TypeToString[qs.Qtype]
	if e.QType == "" {
		e.QType = fmt.Sprintf("TYPE%d", qs.Qtype)
	}
	pol, err := p.cfg.Policies.Policy(ctx, token)
	if err != nil {
		e.Rule, e.Err = "error", err.Error()
		m.Rcode = dns.RcodeRefused
		return m
	}
	rule, ok, askable := verdict(pol, a, p.guard.callback, true)
	if !ok && askable && pol.Ask && p.cfg.Asker != nil {
		if pol, rule, ok, err = p.hold(ctx, a, true); err != nil {
			e.Rule, e.Err = "error", err.Error()
			m.Rcode = dns.RcodeServerFailure
			return m
		}
	}
	e.Rule = rule
	if !ok {
		m.Rcode = dns.RcodeNameError
		return m
	}
	var network string
	switch qs.Qtype {
	case dns.TypeA:
		network = "ip4"
	case dns.TypeAAAA:
		network = "ip6"
	default:
		// MX, TXT, SRV, HTTPS (which would carry ECH keys), PTR…: the
		// proxy serves addresses and nothing else. An empty answer (no
		// data) tells the client the name exists.
		e.Allowed = true
		e.Rule = rule + "; no " + e.QType + " records are served"
		return m
	}
	addrs, err := p.out.lookup(ctx, token, network, name)
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			// For this type only: the name may have the other one.
			e.Allowed, e.Err = true, "no "+network+" address"
			return m
		}
		e.Rule, e.Err = "error", err.Error()
		m.Rcode = dns.RcodeServerFailure
		return m
	}
	denial := ""
	for _, ad := range addrs {
		ad = ad.Unmap()
		if r, ok := p.guard.checkAddr(ad); !ok {
			if denial == "" {
				denial = r
			}
			continue
		}
		if !e.Addr.IsValid() {
			e.Addr = ad
		}
		hdr := dns.RR_Header{Name: qs.Name, Class: dns.ClassINET, Ttl: dnsTTL}
		if ad.Is4() && qs.Qtype == dns.TypeA {
			hdr.Rrtype = dns.TypeA
			m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.IP(ad.AsSlice())})
		} else if ad.Is6() && qs.Qtype == dns.TypeAAAA {
			hdr.Rrtype = dns.TypeAAAA
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: net.IP(ad.AsSlice())})
		}
	}
	if len(m.Answer) == 0 && denial != "" {
		// Every address is one the job may not reach: the name is, for
		// the job, nowhere.
		e.Rule = denial
		m.Rcode = dns.RcodeNameError
		return m
	}
	e.Allowed = true
	return m
}
