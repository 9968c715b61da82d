package proxmox

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"

	"github.com/delegate-dev/delegate/sandbox"
)

// The job's stdout and stderr in the guest. A guest has no program of
// delegate's: where the template has perl (every Debian and Ubuntu system
// does: perl-base is essential there), supervisorScript sits between the
// runner and the command, reads the command's stdout and stderr from two
// pipes, appends what it reads of either to guestOutput in the order it
// reads it, and appends a line "OFFSET STREAM" to guestOutput.streams
// (streamsSuffix) before the bytes, each time the stream changes: the
// output from OFFSET on is of STREAM (1 stdout, 2 stderr), up to the next
// line's. The local sandbox's shim does the same (local/streams.go), in
// binary. Without perl the command's stdout and stderr both go to
// guestOutput, as they come, and read as sandbox.Combined.
//
// When both streams have something at once, stdout is read first (perl's
// select says what is ready, not in which order it became ready). When the
// command has exited, what is left in the pipes is read (for at most a
// second: a background process of the command's may keep writing), then
// perl exits with the command's status (128+signal when a signal killed
// it), which the runner records.
const supervisorScript = `use strict; use warnings; use POSIX ();
my ($o, @cmd) = @ARGV;
$SIG{PIPE} = 'IGNORE';
pipe(my $or, my $ow) && pipe(my $er, my $ew) or die "delegate: pipe: $!\n";
defined(my $pid = fork) or die "delegate: fork: $!\n";
if (!$pid) {
	POSIX::dup2(fileno $ow, 1) && POSIX::dup2(fileno $ew, 2) or POSIX::_exit(125);
	$SIG{PIPE} = 'DEFAULT';
	{ no warnings 'exec'; exec { $cmd[0] } @cmd; }
	print STDERR "delegate: cannot run $cmd[0]: $!\n";
	POSIX::_exit(127);
}
close $ow; close $ew;
open(my $out, '>>', $o) && open(my $idx, '>>', "$o.streams") or die "delegate: $o: $!\n";
my ($n, $cur, $st, $end) = ((-s $out) || 0, 0);
my @in = ($or, $er);
sub put {
	my ($fh, $d) = @_;
	while (length $d) {
		my $w = syswrite($fh, $d);
		if (!defined $w) { next if $!{EINTR}; return }
		substr($d, 0, $w, '');
	}
}
$SIG{CHLD} = sub {};
while (grep defined, @in) {
	if (!defined $st && waitpid($pid, POSIX::WNOHANG()) == $pid) { ($st, $end) = ($?, time + 1) }
	last if defined $end && time > $end;
	my $rin = '';
	vec($rin, fileno $_, 1) = 1 for grep defined, @in;
	my $k = select(my $rout = $rin, undef, undef, defined $st ? 0 : 1);
	if ($k < 0) { next if $!{EINTR}; last }
	last if $k == 0 && defined $st;
	for my $i (0, 1) {
		my $fh = $in[$i];
		next unless defined $fh && vec($rout, fileno $fh, 1);
		my $r = sysread($fh, my $buf, 65536);
		next if !defined $r && $!{EINTR};
		if (!$r) { close $fh; $in[$i] = undef; next }
		if ($cur != $i + 1) { $cur = $i + 1; put($idx, "$n $cur\n") }
		put($out, $buf);
		$n += $r;
	}
}
if (!defined $st) { waitpid($pid, 0); $st = $? }
exit(($st & 127) ? 128 + ($st & 127) : $st >> 8);`

// streamsSuffix names the file of stream records beside the output.
const streamsSuffix = ".streams"

// streamRec says that the output from off on is of stream s.
type streamRec struct {
	off int64
	s   sandbox.Stream
}

// streamRecs are the records of one command's output read so far.
type streamRecs struct {
	recs    []streamRec
	read    int64  // bytes of the records file parsed (whole lines)
	partial []byte // the start of a line not read to its end yet
	from    int64  // records before the first kept were dropped: offsets from here on are known
}

// add parses what the records file holds from r.read on.
func (r *streamRecs) add(b []byte) error {
	r.partial = append(r.partial, b...)
	for {
		i := bytes.IndexByte(r.partial, '\n')
		if i < 0 {
			return nil
		}
		line := r.partial[:i]
		off, s, ok := bytes.Cut(line, []byte{' '})
		n, err := strconv.ParseInt(string(off), 10, 64)
		if !ok || err != nil || n < 0 || (string(s) != "1" && string(s) != "2") ||
			(len(r.recs) > 0 && n < r.recs[len(r.recs)-1].off) {
			return fmt.Errorf("bad stream record %q", line)
		}
		r.recs = append(r.recs, streamRec{n, sandbox.Stream(s[0] - '0')})
		r.read += int64(i + 1)
		r.partial = r.partial[i+1:]
	}
}

// split cuts data, the output from offset on, into pieces by the records.
// complete says that every record written when data was read is known;
// otherwise data is cut where the last known record starts, for a later
// record may split what follows. Records before the one that covers
// offset are dropped: reads move on.
func (r *streamRecs) split(offset int64, data []byte, complete bool) []sandbox.Output {
	i := sort.Search(len(r.recs), func(i int) bool { return r.recs[i].off > offset }) - 1
	if i > 0 {
		r.recs, r.from = r.recs[i:], r.recs[i].off
		i = 0
	}
	end := offset + int64(len(data))
	if !complete {
		if len(r.recs) == 0 {
			return nil
		}
		end = min(end, max(offset, r.recs[len(r.recs)-1].off))
	}
	var outs []sandbox.Output
	cur, pos := sandbox.Combined, offset // bytes before any record (there are none) are Combined
	if i == 0 {
		cur = r.recs[0].s
	}
	for _, rec := range r.recs[max(i, 0):] {
		if rec.off >= end {
			break
		}
		if rec.off > pos {
			outs = sandbox.Append(outs, cur, data[pos-offset:rec.off-offset])
			pos = rec.off
		}
		cur = rec.s
	}
	if pos < end {
		outs = sandbox.Append(outs, cur, data[pos-offset:end-offset])
	}
	return outs
}
