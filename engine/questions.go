package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"reflect"
	"regexp"
	"sync"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/sandbox"
)

// AnswersDir is where, inside the sandbox, the answers to a job's own
// questions appear: QUESTION_ID.json, one JSON object, written whole once
// the answer is given (the job polls for it; $DELEGATE_ANSWERS names the
// directory). It is in the workspace because writing there is what every
// backend can do in a running sandbox (Sandbox.WriteFile), the local one
// without following a link the job may have made.
const AnswersDir = delegate.Workspace + "/.delegate/answers"

// questions is the part that puts questions on jobs and takes their
// answers (delegate.QuestionService): a question is stored before the ask
// is acknowledged and shown to watchers; an answer is checked against the
// question's form, stored, and delivered — to whoever waits for it in
// this process at once, to a job's sandbox by the engine that runs the
// job. An answer may be given in another process sharing the store (the
// CLI): waiters and the engine running the job read the store again every
// poll. It has its own lock, and holds it while it calls nothing else.
type questions struct {
	store    delegate.Store
	jobs     *jobWriter
	progress *progressWriter
	log      *slog.Logger
	// poll is how often a waiter, or the engine running a job with open
	// questions, reads the store again; idle is how often the latter
	// looks for questions it did not see asked (a callback another
	// process received).
	poll, idle time.Duration

	mu      sync.Mutex
	changed chan struct{}        // closed and replaced when this process asks or answers
	follows map[string]*delivery // the jobs this engine runs, by id
}

// delivery is what the engine running a job knows of its answers.
type delivery struct {
	sb        sandbox.Instance
	delivered map[string]bool // answers written in the sandbox
	refusals  int             // refusals written in the sandbox
	open      bool            // the job waits for an answer, as last read
	due       time.Time       // when to read the job's questions again
}

func newQuestions(store delegate.Store, jobs *jobWriter, progress *progressWriter, log *slog.Logger, poll time.Duration) *questions {
	return &questions{store: store, jobs: jobs, progress: progress, log: log, poll: poll, idle: 5 * poll,
		changed: make(chan struct{}), follows: make(map[string]*delivery)}
}

// fromRE is what a part of delegate that asks on a job's behalf calls
// itself.
var fromRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`) })

// ask stores a question, or finds it asked already; added says which.
func (q *questions) ask(ctx context.Context, jobID string, in delegate.Question) (*delegate.Question, bool, error) {
	in.JobID, in.Answer, in.State = jobID, nil, ""
	if in.From == "" {
		in.From = delegate.QuestionFromJob
	}
	if in.From != delegate.QuestionFromJob {
		// delegate's own ids hold a colon, which a job's cannot: the two
		// never collide.
		if !fromRE().MatchString(in.From) {
			return nil, false, &delegate.FieldError{Field: "from", Rule: fmt.Sprintf("must be %q or the name of a part of delegate (got %q)", delegate.QuestionFromJob, in.From)}
		}
		if in.ID == "" {
			var b [6]byte
			rand.Read(b[:])
			in.ID = in.From + ":" + hex.EncodeToString(b[:])
		} else if len(in.ID) <= len(in.From)+1 || in.ID[:len(in.From)+1] != in.From+":" {
			return nil, false, &delegate.FieldError{Field: "id", Rule: fmt.Sprintf("a question from %s has an id %q, or none", in.From, in.From+":…")}
		}
	}
	if err := in.Validate(); err != nil {
		return nil, false, err
	}
	job, existing, err := q.read(ctx, jobID)
	if err != nil {
		return nil, false, err
	}
	for i := range existing {
		if existing[i].ID == in.ID {
			return q.same(&existing[i], &in)
		}
	}
	if job.Status.Terminal() {
		return nil, false, fmt.Errorf("job %s is %s: %w; it asks nothing more", jobID, job.Status, delegate.ErrTerminal)
	}
	if job.Status != delegate.StatusRunning {
		return nil, false, fmt.Errorf("job %s is %s: a job asks once it runs: %w", jobID, job.Status, delegate.ErrConflict)
	}
	open := 0
	for _, x := range existing {
		if x.State == delegate.QuestionOpen {
			open++
		}
	}
	switch {
	case len(existing) >= delegate.MaxQuestions:
		return nil, false, fmt.Errorf("job %s has asked %d questions, the most a job may ask: %w", jobID, len(existing), delegate.ErrConflict)
	case open >= delegate.MaxOpenQuestions:
		return nil, false, fmt.Errorf("job %s has %d questions waiting for an answer, the most at once: %w", jobID, open, delegate.ErrConflict)
	}
	in.AskedAt = time.Now().UTC()
	stored, added, err := q.store.AddQuestion(ctx, &in)
	if err != nil {
		return nil, false, err
	}
	if !added { // asked at the same moment, elsewhere
		return q.same(stored, &in)
	}
	stored.State = delegate.QuestionOpen
	q.log.Info("question asked", "job", jobID, "question", stored.ID, "from", stored.From)
	// Stored now, not with the job's other progress: an answer given in
	// another process at once must come after it on the timeline.
	q.progress.report(jobID, clip("asked "+stored.ID+": "+stored.Message), nil, job.Manifest.StatusMode != delegate.StatusModeSimple, stored.AskedAt)
	q.progress.flushJob(ctx, jobID)
	q.wake(jobID, true)
	q.jobs.notify(jobID)
	return stored, true, nil
}

// same returns the stored question if in asks it again, and a conflict if
// in reuses its id for another question.
func (q *questions) same(stored, in *delegate.Question) (*delegate.Question, bool, error) {
	if stored.From != in.From || stored.Message != in.Message || !reflect.DeepEqual(stored.Form, in.Form) || !stored.Expires.Equal(in.Expires) {
		return nil, false, fmt.Errorf("question %s of job %s was asked already, as another question: %w; a question's id is never reused", in.ID, in.JobID, delegate.ErrConflict)
	}
	return stored, false, nil
}

// read returns a job and its questions, each with its state.
func (q *questions) read(ctx context.Context, jobID string) (*delegate.Job, []delegate.Question, error) {
	job, err := q.store.GetJob(ctx, jobID)
	if err != nil {
		return nil, nil, err
	}
	qs, err := q.store.Questions(ctx, jobID)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	for i := range qs {
		qs[i].State = qs[i].StateAt(job.Status, now)
	}
	return job, qs, nil
}

// find returns one question of a job.
func (q *questions) find(ctx context.Context, jobID, id string) (*delegate.Job, *delegate.Question, error) {
	job, qs, err := q.read(ctx, jobID)
	if err != nil {
		return nil, nil, err
	}
	for i := range qs {
		if qs[i].ID == id {
			return job, &qs[i], nil
		}
	}
	return nil, nil, delegate.QuestionNotFound(jobID, id)
}

// answer checks, stores and delivers an answer.
func (q *questions) answer(ctx context.Context, jobID, id string, a delegate.Answer) (*delegate.Question, error) {
	job, question, err := q.find(ctx, jobID, id)
	if err != nil {
		return nil, err
	}
	switch question.State {
	case delegate.QuestionAnswered:
		return question, fmt.Errorf("question %s of job %s was answered already (%s, %s): %w", id, jobID,
			question.Answer.Action, question.Answer.At.Format(time.RFC3339), delegate.ErrConflict)
	case delegate.QuestionClosed:
		if job.Status.Terminal() {
			return question, fmt.Errorf("job %s is %s: %w; its questions closed unanswered", jobID, job.Status, delegate.ErrTerminal)
		}
		return question, fmt.Errorf("question %s of job %s expired unanswered at %s: %w", id, jobID, question.Expires.Format(time.RFC3339), delegate.ErrConflict)
	}
	a, err = question.CheckAnswer(a)
	if err != nil {
		return nil, err
	}
	a.At = time.Now().UTC()
	stored, err := q.store.AnswerQuestion(ctx, jobID, id, a)
	if err != nil {
		return stored, err
	}
	stored.State = delegate.QuestionAnswered
	q.log.Info("question answered", "job", jobID, "question", id, "action", a.Action, "by", a.By)
	// On the timeline, and as the job's progress, without counting as a
	// sign of the job's life (it is the person's): after what the job
	// reported before (its question), which is stored first.
	msg := "answered " + id + ": " + string(a.Action)
	q.progress.flushJob(ctx, jobID)
	if job.Manifest.StatusMode != delegate.StatusModeSimple {
		if err := q.store.AddEvent(ctx, jobID, delegate.Event{Time: a.At, Message: msg}, delegate.MaxTimeline); err != nil {
			q.log.Warn("timeline", "job", jobID, "err", err)
		}
	}
	q.wake(jobID, false)
	if _, err := q.jobs.update(notOwner(ctx), jobID, func(j *delegate.Job) error {
		if j.Status.Terminal() {
			return delegate.ErrTerminal
		}
		j.Progress = msg
		return nil
	}); err != nil && !errors.Is(err, delegate.ErrTerminal) {
		q.log.Warn("progress", "job", jobID, "err", err)
	}
	return stored, nil
}

// await waits until a question is no longer open, or ctx is done.
func (q *questions) await(ctx context.Context, jobID, id string) (*delegate.Question, error) {
	for {
		changed, jobChanged := q.changes(), q.jobs.changes()
		// A read of the local store must not fail because the caller's
		// wait is up at that very moment.
		_, question, err := q.find(context.WithoutCancel(ctx), jobID, id)
		if err != nil || question.State != delegate.QuestionOpen {
			return question, err
		}
		wait := q.poll
		if !question.Expires.IsZero() {
			wait = min(wait, max(time.Until(question.Expires), time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return question, nil
		case <-changed:
		case <-jobChanged:
		case <-time.After(wait):
		}
	}
}

func (q *questions) changes() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.changed
}

// wake tells this process's waiters that a question of job was asked or
// answered, and the engine running the job to look at its questions now.
func (q *questions) wake(jobID string, asked bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	close(q.changed)
	q.changed = make(chan struct{})
	if d := q.follows[jobID]; d != nil {
		d.due = time.Time{}
		if asked {
			d.open = true
		}
	}
}

// follow: this engine runs job id in sb; its answers go there.
func (q *questions) follow(id string, sb sandbox.Instance) {
	q.mu.Lock()
	defer q.mu.Unlock()
	// Everything answered is written again after a restart: an answer
	// given while no engine ran the job reaches it, and one written
	// before is written with the same bytes.
	q.follows[id] = &delivery{sb: sb, delivered: map[string]bool{}}
}

// unfollow: the job's run has ended here.
func (q *questions) unfollow(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.follows, id)
}

// deliver writes in a job's sandbox the answers to its questions that are
// not there yet. The follow loop calls it at each tick; it reads the
// store only when due: at once after an ask or an answer in this process,
// every poll while the job waits for an answer, every idle otherwise.
func (q *questions) deliver(ctx context.Context, id string) {
	now := time.Now()
	q.mu.Lock()
	d := q.follows[id]
	if d == nil || now.Before(d.due) {
		q.mu.Unlock()
		return
	}
	d.due = now.Add(q.idle)
	if d.open {
		d.due = now.Add(q.poll)
	}
	sb := d.sb
	q.mu.Unlock()

	qs, err := q.store.Questions(ctx, id)
	if err != nil {
		q.log.Warn("read questions", "job", id, "err", err)
		return
	}
	open := false
	for _, x := range qs {
		if x.From != delegate.QuestionFromJob {
			continue // its answer is for the part that asked
		}
		if x.Answer == nil {
			open = true
			continue
		}
		q.mu.Lock()
		done := d.delivered[x.ID]
		q.mu.Unlock()
		if done {
			continue
		}
		if err := writeAnswer(ctx, sb, x.ID, answerFile{ID: x.ID, Action: x.Answer.Action, Content: x.Answer.Content, At: x.Answer.At}); err != nil {
			q.log.Warn("deliver an answer", "job", id, "question", x.ID, "err", err)
			open = true // try again at the next poll
			continue
		}
		q.log.Debug("answer delivered", "job", id, "question", x.ID)
		q.mu.Lock()
		d.delivered[x.ID] = true
		q.mu.Unlock()
	}
	q.mu.Lock()
	d.open = open
	if open && d.due.After(now.Add(q.poll)) {
		d.due = now.Add(q.poll)
	}
	q.mu.Unlock()
}

// answerFile is what the job finds in AnswersDir/ID.json: the answer, or
// why its question was refused.
type answerFile struct {
	ID      string                `json:"id"`
	Action  delegate.AnswerAction `json:"action,omitempty"`
	Content map[string]any        `json:"content,omitempty"`
	At      time.Time             `json:"answered_at,omitzero"`
	// Error says why the question was not asked (a status line that
	// asked it gets no other reply).
	Error string `json:"error,omitempty"`
}

func writeAnswer(ctx context.Context, sb sandbox.Instance, id string, f answerFile) error {
	data, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return sb.WriteFile(ctx, path.Join(AnswersDir, id+".json"), append(data, '\n'), 0o644)
}

// questionLine is a status line that asks a question.
type questionLine struct {
	Type            string          `json:"type"`
	ID              string          `json:"id"`
	Message         string          `json:"message"`
	RequestedSchema json.RawMessage `json:"requestedSchema"`
}

// questionScanner finds the status lines that ask questions in a stream
// of status lines, however many others come with them: it looks only
// around the places where "question" is written, and makes no string of
// any other line.
type questionScanner struct {
	partial []byte
	seen    map[string]bool // question lines handled already
}

// What a job's status channel may make the follow loop do about
// questions, so that a flood of question lines cannot hold it up (a job
// is killed at its timeout whatever it writes; TestQuestionFlood): at
// most questionLinesPerTick distinct question lines are asked per tick of
// the loop, and as many at the job's end, however many reads of the
// channel that takes (a line seen before is skipped; past the budget the
// other question lines are dropped, which only a flood reaches), and at
// most maxRefusalFiles refusals are written into the sandbox. (The budget
// was per read, of 64 KiB: a tick of four reads asked 128 questions, each
// a store transaction and a read, and the end of a job that had flooded
// the channel up to 4,096: seconds a tick and tens of seconds at the end
// on a loaded machine, the timeout seconds late.)
const (
	questionLinesPerTick = 32
	maxSeenLines         = 1024
	maxRefusalFiles      = 16
)

// questions calls ask with each question line of b not seen before, while
// budget lasts (each ask takes one).
func (s *questionScanner) questions(b []byte, final bool, budget *int, ask func(line string)) {
	s.scan(b, final, func(line []byte) { s.take(line, budget, ask) })
}

// take asks line if it was not seen and the budget allows.
func (s *questionScanner) take(line []byte, budget *int, ask func(line string)) {
	if *budget <= 0 || s.seen[string(line)] {
		return
	}
	*budget--
	if s.seen == nil {
		s.seen = map[string]bool{}
	}
	if len(s.seen) < maxSeenLines {
		s.seen[string(line)] = true
	}
	ask(string(line))
}

// scan calls fn with each complete line of b (after what was held from
// before) that asks a question; final flushes an unterminated last line.
func (s *questionScanner) scan(b []byte, final bool, fn func(line []byte)) {
	check := func(line []byte) {
		if isQuestionLine(line) {
			fn(line)
		}
	}
	if len(s.partial) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			s.hold(b)
			if final {
				check(s.partial)
				s.partial = nil
			}
			return
		}
		check(append(s.partial, b[:i]...))
		s.partial, b = nil, b[i+1:]
	}
	end := bytes.LastIndexByte(b, '\n') + 1
	complete, rest := b[:end], b[end:]
	for off := 0; ; {
		j := bytes.Index(complete[off:], []byte(`"question"`))
		if j < 0 {
			break
		}
		at := off + j
		start := bytes.LastIndexByte(complete[:at], '\n') + 1
		stop := at + bytes.IndexByte(complete[at:], '\n')
		check(complete[start:stop])
		off = stop + 1
	}
	s.hold(rest)
	if final && len(s.partial) > 0 {
		check(s.partial)
		s.partial = nil
	}
}

// hold keeps b as the start of the next line; a "line" longer than a
// status line may be is dropped, as lineSplitter drops it.
func (s *questionScanner) hold(b []byte) {
	if len(s.partial)+len(b) > 64<<10 {
		s.partial = s.partial[:0]
		return
	}
	s.partial = append(s.partial, b...)
}

// isQuestionLine is a cheap first look: a status line that may ask a
// question (most lines are not parsed further).
func isQuestionLine(line []byte) bool {
	return bytes.HasPrefix(bytes.TrimSpace(line), []byte("{")) && bytes.Contains(line, []byte(`"question"`))
}

// statusLine asks the question a job's status line asks. A question the
// job may not ask is refused in the job's progress and, when its id can
// name a file and no question has it, in the answer file, so that a job
// waiting for it learns why at once.
func (q *questions) statusLine(ctx context.Context, jobID, line string) {
	var l questionLine
	if json.Unmarshal([]byte(line), &l) != nil || l.Type != "question" {
		return
	}
	in := delegate.Question{ID: l.ID, From: delegate.QuestionFromJob, Message: l.Message}
	var err error
	if len(l.RequestedSchema) > 0 && string(l.RequestedSchema) != "null" {
		in.Form, err = delegate.ParseForm(l.RequestedSchema)
	}
	if err == nil {
		_, _, err = q.ask(ctx, jobID, in)
	}
	if err == nil || ctx.Err() != nil {
		return
	}
	q.log.Info("question refused", "job", jobID, "question", l.ID, "err", err)
	q.progress.report(jobID, clip(fmt.Sprintf("question %q refused: %v", l.ID, err)), nil, true, time.Now().UTC())
	if !delegate.ValidQuestionID(l.ID) {
		return // the id names no file
	}
	if _, _, ferr := q.find(ctx, jobID, l.ID); ferr == nil {
		return // a question that has the id has the file too
	}
	q.mu.Lock()
	d := q.follows[jobID]
	if d != nil && d.refusals < maxRefusalFiles {
		d.refusals++
	} else {
		d = nil // enough said in the sandbox: the progress says the rest
	}
	q.mu.Unlock()
	if d == nil {
		return
	}
	if werr := writeAnswer(ctx, d.sb, l.ID, answerFile{ID: l.ID, Error: err.Error()}); werr != nil {
		q.log.Warn("write a refusal", "job", jobID, "question", l.ID, "err", werr)
	}
}
