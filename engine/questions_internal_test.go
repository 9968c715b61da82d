package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/internal/testkit"
	"github.com/delegate-dev/delegate/sandbox"
	"github.com/delegate-dev/delegate/sandboxtest"
	"github.com/delegate-dev/delegate/storetest"
)

// TestQuestionScanner: the question lines of a stream of status lines are
// found however the stream is cut into reads, among floods of other
// lines, and a last line without its newline is found at the end.
func TestQuestionScanner(t *testing.T) {
	t.Parallel()
	q1 := `{"type":"question","id":"a","message":"A?"}`
	q2 := `  {"type": "question", "id":"b","message":"B?"}`
	noise := strings.Repeat("step\n", 1000)
	stream := noise + q1 + "\n" + `plain text naming "question" is no question` + "\n" + noise + q2
	want := []string{q1, q2}
	for _, size := range []int{1, 7, 64, 4096, len(stream)} {
		var s questionScanner
		var got []string
		for off := 0; off < len(stream); off += size {
			s.scan([]byte(stream[off:min(off+size, len(stream))]), false, func(line []byte) { got = append(got, string(line)) })
		}
		s.scan(nil, true, func(line []byte) { got = append(got, string(line)) })
		if !slices.Equal(got, want) {
			t.Errorf("reads of %d bytes: found %q, want %q", size, got, want)
		}
	}
}

// askCounter counts the reads of a job: asking a question makes one, and
// one more when it is refused (questions.find).
type askCounter struct {
	delegate.Store
	reads atomic.Int64
}

func (c *askCounter) GetJob(ctx context.Context, id string) (*delegate.Job, error) {
	c.reads.Add(1)
	return c.Store.GetJob(ctx, id)
}

// TestQuestionBudgetPerTick: one tick of a job's follow loop asks at most
// questionLinesPerTick questions, however many reads of the status channel
// the tick makes (a flood fills four); so does the job's end. The budget
// was per read: under a flood a tick asked 128, each a store transaction
// and a read, which held the loop from its timer (TestQuestionFlood's 2 s
// job ran past 7 s, its end past 30 s, on a loaded machine).
func TestQuestionBudgetPerTick(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, final := range []bool{false, true} {
		store := &askCounter{Store: testkit.OpenStore(t)}
		job := storetest.NewJob(fmt.Sprint("job-final-", final))
		job.Status, job.StartedAt = delegate.StatusRunning, time.Now().UTC()
		if err := store.CreateJob(ctx, job); err != nil {
			t.Fatal(err)
		}
		sb, err := sandboxtest.NewFake().Create(ctx, sandbox.Spec{JobID: job.ID})
		if err != nil {
			t.Fatal(err)
		}
		proc, err := sb.Exec(ctx, sandbox.Command{Args: []string{"flood"}})
		if err != nil {
			t.Fatal(err)
		}
		p := proc.(*sandboxtest.Process)
		for n := 0; n*60 < 2*eventsPerTick; n++ { // two ticks' worth, each line a new question
			p.Event(fmt.Sprintf(`{"type":"question","id":"q%d","message":"Question %d?"}`, n, n))
		}
		jobs := newJobWriter(store, func(*delegate.Job) {})
		progress := newProgressWriter(store, jobs.notify, discardLogger)
		f := &follower{log: discardLogger, store: store, jobs: jobs, progress: progress,
			questions: newQuestions(store, jobs, progress, discardLogger, time.Second)}
		tr := &tracker{f: f, id: job.ID, m: job.Manifest, proc: proc, redact: newRedactor(nil)}
		f.questions.follow(job.ID, sb)
		tr.collectEvents(ctx, final)
		f.questions.unfollow(job.ID)
		if tr.eventsRead < eventsPerTick {
			t.Fatalf("final %v: the collect read %d bytes of the status channel, want a tick's %d at least", final, tr.eventsRead, eventsPerTick)
		}
		if reads := store.reads.Load(); reads < questionLinesPerTick || reads > 2*questionLinesPerTick {
			t.Errorf("final %v: %d reads of the job in one collect of %d bytes, want %d questions asked (a read each, two when refused)",
				final, reads, tr.eventsRead, questionLinesPerTick)
		}
	}
}
