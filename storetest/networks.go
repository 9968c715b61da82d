package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

// testNetworks: a network is found by its id and by its token's hash, its
// CA comes back as stored, an update keeps its id and token, and an ended
// one is not live.
func testNetworks(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	now := time.Now().UTC().Truncate(time.Millisecond)
	n := &delegate.NetworkState{ID: "job-net1", Policy: delegate.Allowlist("pypi.org", "*.pythonhosted.org"), Inject: []string{"GH"},
		TokenHash: "hash1", Token: "tok1", CA: []byte("-----BEGIN CERTIFICATE-----\nx\n"), CreatedAt: now}
	if err := s.CreateNetwork(ctx, n); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateNetwork(ctx, &delegate.NetworkState{ID: "job-net2", Policy: delegate.Egress(), TokenHash: "hash1", CreatedAt: now}); !errors.Is(err, delegate.ErrConflict) {
		t.Errorf("a second network with the same token hash: %v, want ErrConflict", err)
	}
	if err := s.CreateNetwork(ctx, &delegate.NetworkState{ID: "job-net2", Policy: delegate.Egress(), TokenHash: "hash2", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	s = open() // another process
	got, err := s.GetNetwork(ctx, "job-net1")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "job-net1" || got.TokenHash != "hash1" || got.Token != "tok1" || string(got.CA) != string(n.CA) || got.Policy.String() != n.Policy.String() ||
		!slices.Equal(got.Inject, []string{"GH"}) || !got.CreatedAt.Equal(now) {
		t.Errorf("GetNetwork = %+v, want %+v", got, n)
	}
	if byTok, err := s.NetworkByToken(ctx, "hash2"); err != nil || byTok.ID != "job-net2" || byTok.Policy.Mode != delegate.NetworkEgress {
		t.Errorf("NetworkByToken(hash2) = %+v, %v", byTok, err)
	}
	if _, err := s.NetworkByToken(ctx, "nope"); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("unknown token: %v, want ErrNotFound", err)
	}
	if _, err := s.GetNetwork(ctx, "job-none"); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("unknown network: %v, want ErrNotFound", err)
	}
	up, err := s.UpdateNetwork(ctx, "job-net1", func(n *delegate.NetworkState) error {
		n.Policy.Allow = append(n.Policy.Allow, "github.com:443")
		n.ID, n.TokenHash = "other", "other"
		return nil
	})
	if err != nil || up.ID != "job-net1" || up.TokenHash != "hash1" {
		t.Fatalf("UpdateNetwork = %+v, %v", up, err)
	}
	if got, _ := s.GetNetwork(ctx, "job-net1"); !slices.Equal(got.Policy.Allow, []string{"pypi.org", "*.pythonhosted.org", "github.com:443"}) {
		t.Errorf("after widening, allow = %v", got.Policy.Allow)
	}
	boom := errors.New("boom")
	if _, err := s.UpdateNetwork(ctx, "job-net1", func(n *delegate.NetworkState) error { n.Policy.Allow = nil; return boom }); !errors.Is(err, boom) {
		t.Errorf("failed update: %v", err)
	}
	if got, _ := s.GetNetwork(ctx, "job-net1"); len(got.Policy.Allow) != 3 {
		t.Error("a failed update wrote")
	}
	live, err := s.LiveNetworks(ctx)
	if err != nil || len(live) != 2 {
		t.Fatalf("LiveNetworks = %d, %v; want 2", len(live), err)
	}
	if _, err := s.UpdateNetwork(ctx, "job-net2", func(n *delegate.NetworkState) error { n.EndedAt = now; n.CA, n.Token = nil, ""; return nil }); err != nil {
		t.Fatal(err)
	}
	live, _ = s.LiveNetworks(ctx)
	if len(live) != 1 || live[0].ID != "job-net1" {
		t.Errorf("LiveNetworks after an end = %+v", live)
	}
}

// testNetworkLog: entries are numbered in order, counted in the summary
// (bytes of allowed ones, denied names once each), read by pages and by
// denials, and past MaxNetworkLog counted without being kept.
func testNetworkLog(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	if err := s.CreateNetwork(ctx, &delegate.NetworkState{ID: "job-log", Policy: delegate.Allowlist("a.test"), TokenHash: "h", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC()
	batch := []delegate.NetworkEntry{
		{Time: at, Via: "connect", Name: "a.test", Addr: "203.0.113.10", Port: 443, Sent: 10, Received: 100, Allowed: true, Rule: "allow a.test"},
		{Time: at, Via: "dns", Name: "b.test", QType: "A", Allowed: false, Rule: "not in allowlist"},
		{Time: at, Via: "transparent-http", Addr: "169.254.169.254", Port: 80, Allowed: false, Rule: "link-local"},
		{Time: at, Via: "policy", Rule: "allowlist widened: b.test"},
		{Time: at, Via: "dns", Name: "b.test", QType: "A", Allowed: false, Rule: "not in allowlist"},
		{Time: at, Via: "log", Lost: 3},
	}
	if err := s.AppendNetworkLog(ctx, "job-log", batch); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendNetworkLog(ctx, "job-none", batch); !errors.Is(err, delegate.ErrNotFound) {
		t.Errorf("log of an unknown network: %v", err)
	}
	s = open()
	all, err := s.NetworkLog(ctx, "job-log", delegate.NetworkLogOptions{})
	if err != nil || len(all) != len(batch) {
		t.Fatalf("NetworkLog = %d entries, %v; want %d", len(all), err, len(batch))
	}
	for i, e := range all {
		if e.Seq != int64(i+1) || e.Via != batch[i].Via {
			t.Errorf("entry %d = %+v", i, e)
		}
	}
	denied, _ := s.NetworkLog(ctx, "job-log", delegate.NetworkLogOptions{Denied: true})
	if len(denied) != 3 || denied[0].Name != "b.test" || denied[1].Addr != "169.254.169.254" {
		t.Errorf("denied entries = %+v", denied)
	}
	page, _ := s.NetworkLog(ctx, "job-log", delegate.NetworkLogOptions{After: 2, Limit: 2})
	if len(page) != 2 || page[0].Seq != 3 || page[1].Seq != 4 {
		t.Errorf("page after 2 = %+v", page)
	}
	n, _ := s.GetNetwork(ctx, "job-log")
	want := delegate.NetworkSummary{Allowed: 1, Denied: 3, Sent: 10, Received: 100, Lost: 3, DeniedNames: []string{"b.test", "169.254.169.254:80"}}
	if fmt.Sprint(n.Summary) != fmt.Sprint(want) {
		t.Errorf("summary = %+v, want %+v", n.Summary, want)
	}
	// Past the cap: counted, not kept.
	more := make([]delegate.NetworkEntry, delegate.MaxNetworkLog)
	for i := range more {
		more[i] = delegate.NetworkEntry{Time: at, Via: "connect", Name: "a.test", Port: 443, Allowed: true}
	}
	if err := s.AppendNetworkLog(ctx, "job-log", more); err != nil {
		t.Fatal(err)
	}
	n, _ = s.GetNetwork(ctx, "job-log")
	if n.Summary.Allowed != 1+delegate.MaxNetworkLog || n.Summary.Unlogged != int64(len(batch)) {
		t.Errorf("after the cap: summary %+v", n.Summary)
	}
	tail, _ := s.NetworkLog(ctx, "job-log", delegate.NetworkLogOptions{After: delegate.MaxNetworkLog - 1})
	if len(tail) != 1 {
		t.Errorf("kept past the cap: %d", len(tail))
	}
}

// testAllowlistManifest: a job's allowlist comes back from the store as
// it was submitted.
func testAllowlistManifest(t *testing.T, open Open) {
	ctx := context.Background()
	s := open()
	j := NewJob("job-allowlist")
	j.Manifest.Network = delegate.Network{Mode: delegate.NetworkAllowlist, Allow: []string{"pypi.org", "github.com:443"}, Ask: true}
	if err := s.CreateJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	got, err := open().GetJob(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Manifest.Network.String() != j.Manifest.Network.String() {
		t.Errorf("network = %v, want %v", got.Manifest.Network, j.Manifest.Network)
	}
}
