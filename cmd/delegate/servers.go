package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/cli"
)

// serverRow is a server as `delegate servers` shows it: its lease, and the
// unfinished jobs (by status) and live kept sandboxes it drives.
type serverRow struct {
	delegate.Server
	Jobs      map[delegate.Status]int `json:"jobs"`
	Sandboxes int                     `json:"sandboxes"`
}

// servers is `delegate servers`: the servers sharing the store, or one
// told to drain.
func servers(ctx context.Context, cfg cli.Config, drain string, asJSON bool, out io.Writer) error {
	st, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	srvs, now, err := st.Servers(ctx)
	if err != nil {
		return err
	}
	if drain != "" {
		return drainServer(ctx, st, srvs, drain, out)
	}
	rows := make([]serverRow, len(srvs))
	index := map[string]int{}
	for i, s := range srvs {
		rows[i] = serverRow{Server: s, Jobs: map[delegate.Status]int{}}
		index[s.ID] = i
	}
	for cursor := ""; ; {
		jobs, next, err := st.ListJobs(ctx, delegate.JobFilter{Active: true, Limit: 200, Cursor: cursor})
		if err != nil {
			return err
		}
		for _, j := range jobs {
			if i, ok := index[j.Owner]; ok {
				rows[i].Jobs[j.Status]++
			}
		}
		if cursor = next; next == "" {
			break
		}
	}
	sbs, err := st.ListSandboxes(ctx, true, delegate.MaxPageSize)
	if err != nil {
		return err
	}
	for _, sb := range sbs {
		if i, ok := index[sb.Owner]; ok {
			rows[i].Sandboxes++
		}
	}
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{"servers": rows, "now": now})
	}
	if len(rows) == 0 {
		fmt.Fprintln(out, "No server holds a lease in this store (servers share a store, with leases, on PostgreSQL: DELEGATE_STORE).")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVER\tHOST\tADDR\tLEASE\tJOBS\tSANDBOXES")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", r.ID, r.Host, or(r.Addr, "-"), lease(r.Server, now), jobCounts(r.Jobs), r.Sandboxes)
	}
	return tw.Flush()
}

// lease says how a server's lease stands at now (the store's clock).
func lease(s delegate.Server, now time.Time) string {
	var st string
	if s.Live {
		st = fmt.Sprintf("live (renewed %s ago, expires in %s)", now.Sub(s.RenewedAt).Round(100*time.Millisecond),
			s.ExpiresAt.Sub(now).Round(100*time.Millisecond))
	} else {
		st = fmt.Sprintf("expired %s ago", now.Sub(s.ExpiresAt).Round(time.Second))
	}
	if s.Draining {
		st += ", draining"
	}
	return st
}

func jobCounts(m map[delegate.Status]int) string {
	var parts []string
	for _, st := range delegate.Statuses {
		if m[st] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", m[st], st))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// drainServer tells the server name (an id, or its unique start) to drain.
func drainServer(ctx context.Context, st store, srvs []delegate.Server, name string, out io.Writer) error {
	var found []delegate.Server
	for _, s := range srvs {
		if s.ID == name {
			found = []delegate.Server{s}
			break
		}
		if strings.HasPrefix(s.ID, name) {
			found = append(found, s)
		}
	}
	switch {
	case len(found) == 0:
		return fmt.Errorf("server %q: %w; 'delegate servers' lists the servers that share this store", name, delegate.ErrNotFound)
	case len(found) > 1:
		ids := make([]string, len(found))
		for i, s := range found {
			ids[i] = s.ID
		}
		slices.Sort(ids)
		return fmt.Errorf("server %q names %d servers (%s): %w; give more of its id", name, len(found), strings.Join(ids, ", "), delegate.ErrInvalid)
	case !found[0].Live:
		return fmt.Errorf("server %s: its lease has expired: %w; it runs nothing (the others adopted its jobs)", found[0].ID, delegate.ErrConflict)
	}
	if err := st.DrainServer(ctx, found[0].ID); err != nil {
		return err
	}
	fmt.Fprintf(out, "Server %s drains: it takes no new jobs (within a renewal of its lease), and its running jobs go on.\n"+
		"Stop it (SIGTERM) when you want: the other servers adopt what it still runs at once.\n", found[0].ID)
	return nil
}
