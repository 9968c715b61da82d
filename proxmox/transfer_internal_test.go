package proxmox

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
)

// TestTransferClaims: a transfer's token opens that transfer, once, for
// its method alone, and not once it ended; a claim says the job.
func TestTransferClaims(t *testing.T) {
	t.Parallel()
	x, off, err := newTransfers("http://10.0.0.7:8765/", time.Second, slog.New(slog.DiscardHandler))
	if err != nil || x == nil {
		t.Fatal(off, err)
	}
	serve := func(http.ResponseWriter, *http.Request) {}
	tr, link, header := x.begin("job-a", http.MethodGet, "workspace in", serve)
	if !strings.HasPrefix(link, "http://10.0.0.7:8765/transfer/") || strings.Contains(link, "Bearer") {
		t.Errorf("link %s", link)
	}
	token := strings.TrimSuffix(strings.TrimPrefix(string(header), "Authorization: Bearer "), "\n")
	id := strings.TrimPrefix(link, "http://10.0.0.7:8765/transfer/")
	for _, c := range []struct{ id, method, token string }{
		{id, http.MethodGet, token + "x"},
		{id, http.MethodPut, token},
		{map[byte]string{'0': "1"}[id[0]] + map[bool]string{true: "0"}[id[0] != '0'] + id[1:], http.MethodGet, token}, // another id
		{id, http.MethodGet, ""},
	} {
		if _, _, err := x.Claim(c.id, c.method, c.token); !errors.Is(err, delegate.ErrUnauthenticated) {
			t.Errorf("claim %+v: %v", c, err)
		}
	}
	job, h, err := x.Claim(id, http.MethodGet, token)
	if err != nil || job != "job-a" || h == nil {
		t.Fatalf("claim: %q %v", job, err)
	}
	select {
	case <-tr.claimed:
	default:
		t.Error("the claim was not told")
	}
	if _, _, err := x.Claim(id, http.MethodGet, token); err == nil {
		t.Error("claimed twice")
	}
	if !x.end(tr) {
		t.Error("end does not know it was claimed")
	}
	tr2, link2, header2 := x.begin("job-b", http.MethodPut, "workspace out", serve)
	if x.end(tr2) {
		t.Error("an unclaimed transfer ended as claimed")
	}
	tok2 := strings.TrimSuffix(strings.TrimPrefix(string(header2), "Authorization: Bearer "), "\n")
	if _, _, err := x.Claim(strings.TrimPrefix(link2, "http://10.0.0.7:8765/transfer/"), http.MethodPut, tok2); err == nil {
		t.Error("an ended transfer was claimed")
	}
}

// fakeGuest is a guest whose commands all exited 0 at once.
type fakeGuest struct{ runs [][]string }

func (g *fakeGuest) start(context.Context, []string, []byte) (int, error) { return 1, nil }
func (g *fakeGuest) status(context.Context, int, string) (result, bool, error) {
	return result{}, true, nil
}
func (g *fakeGuest) wait(context.Context, int, string) (result, error) { return result{}, nil }
func (g *fakeGuest) run(_ context.Context, argv []string) (result, error) {
	g.runs = append(g.runs, argv)
	return result{}, nil
}

// TestUploadChecked: the workspace a guest sends is handed on as it
// arrives, but its last holdBack bytes only once the whole of it came
// and its size and sha256 are the guest's: a tar reader of an archive
// that changed on the way never reaches its end, and the archive left in
// the guest is removed at Close.
func TestUploadChecked(t *testing.T) {
	t.Parallel()
	var tarball bytes.Buffer
	zw := gzip.NewWriter(&tarball)
	tw := tar.NewWriter(zw)
	body := make([]byte, 200<<10) // random: its archive is larger than holdBack
	r := rand.New(rand.NewPCG(1, 2))
	for i := range body {
		body[i] = byte(r.Uint32())
	}
	tw.WriteHeader(&tar.Header{Name: "f", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
	tw.Write(body)
	tw.Close()
	zw.Close()
	good := tarball.Bytes()
	sum := sha256.Sum256(good)
	for _, c := range []struct {
		name string
		sent []byte
		ok   bool
	}{
		{"whole", good, true},
		{"changed", append(append([]byte(nil), good[:len(good)-20]...), append([]byte{good[len(good)-20] ^ 1}, good[len(good)-19:]...)...), false},
		{"cut", good[:len(good)-10], false},
	} {
		t.Run(c.name, func(t *testing.T) {
			pr, pw := io.Pipe()
			go func() {
				for b := c.sent; len(b) > 0; b = b[min(len(b), 4096):] {
					pw.Write(b[:min(len(b), 4096)])
				}
				pw.Close()
			}()
			g := &fakeGuest{}
			u := &upload{ctx: context.Background(), g: g, pr: pr, stop: func() bool { return true }, file: "/workspace/.delegate-xfer-x.tgz",
				h: sha256.New(), wantSum: hex.EncodeToString(sum[:]), wantN: int64(len(good)), ended: &result{}}
			zr, err := gzip.NewReader(u)
			var got []byte
			if err == nil {
				tr := tar.NewReader(zr)
				if _, err = tr.Next(); err == nil {
					got, err = io.ReadAll(tr)
				}
				if err == nil {
					_, err = tr.Next()
				}
			}
			if c.ok != (err == io.EOF && bytes.Equal(got, body)) {
				t.Errorf("read: %v (%d bytes)", err, len(got))
			}
			if !c.ok && err != nil && err != io.EOF && !strings.Contains(err.Error(), "changed on the way") && !strings.Contains(err.Error(), "unexpected EOF") {
				t.Errorf("the error says %v", err)
			}
			u.Close()
			if removed := len(g.runs) > 0; removed == c.ok {
				t.Errorf("removed in the guest: %v (runs %v)", removed, g.runs)
			}
		})
	}
}
