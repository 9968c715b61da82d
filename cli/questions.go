package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/delegate-dev/delegate"
	"github.com/spf13/cobra"
)

// The questions jobs ask (the root's question.go), shown and answered from
// the command line: what an MCP client with Tasks sees as input_required.

// withQuestions runs fn with the question service over the data dir.
func (p *Program) withQuestions(ctx context.Context, cfg Config, fn func(delegate.QuestionService) error) error {
	return p.withServices(ctx, cfg, func(s Services) error {
		if s.Questions == nil {
			return errors.New("this job service takes no questions")
		}
		return fn(s.Questions)
	})
}

func (p *Program) jobsQuestionsCmd(cfg *Config) *cobra.Command {
	var asJSON, all bool
	cmd := &cobra.Command{
		Use:   "questions ID [flags]",
		Short: "Show the questions a job waits for answers to",
		Long: `Show the questions a job asks that wait for an answer, each with the fields
of its form; with --all, the answered and closed ones too. Answer one with
"delegate jobs answer".`,
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return p.withQuestions(ctx, *cfg, func(qs delegate.QuestionService) error {
				list, err := qs.Questions(ctx, args[0])
				if err != nil {
					return err
				}
				shown := []delegate.Question{}
				for _, q := range list {
					if all || q.State == delegate.QuestionOpen {
						shown = append(shown, q)
					}
				}
				if asJSON {
					return p.printJSON(shown)
				}
				if len(shown) == 0 {
					fmt.Fprintf(p.Stderr, "%s waits for no answer\n", args[0])
					return nil
				}
				for _, q := range shown {
					p.printQuestion(args[0], q)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&all, "all", false, "also the questions answered or closed")
	return cmd
}

func (p *Program) printQuestion(jobID string, q delegate.Question) {
	w := p.Stdout
	fmt.Fprintf(w, "%s  %s  asked %s", safe(q.ID), q.State, q.AskedAt.Local().Format(time.DateTime))
	if q.From != delegate.QuestionFromJob {
		fmt.Fprintf(w, " by %s", safe(q.From))
	}
	fmt.Fprintln(w)
	for _, line := range strings.Split(q.Message, "\n") {
		fmt.Fprintf(w, "  %s\n", safe(line))
	}
	for _, f := range q.Form.Fields {
		fmt.Fprintf(w, "  %s=%s\n", safe(f.Name), fieldHelp(f))
	}
	if a := q.Answer; a != nil {
		fmt.Fprintf(w, "  answer: %s", a.Action)
		for _, f := range q.Form.Fields {
			if v, ok := a.Content[f.Name]; ok {
				fmt.Fprintf(w, " %s=%s", safe(f.Name), safe(fmt.Sprint(v)))
			}
		}
		fmt.Fprintf(w, " (%s)\n", a.At.Local().Format(time.DateTime))
	} else if q.State == delegate.QuestionOpen {
		fmt.Fprintf(w, "  answer: delegate jobs answer %s %s", jobID, q.ID)
		for _, f := range q.Form.Fields {
			if f.Required {
				fmt.Fprintf(w, " %s=…", f.Name)
			}
		}
		fmt.Fprintln(w, "   (or --decline)")
	}
}

// fieldHelp says what a field takes, in a line.
func fieldHelp(f delegate.Field) string {
	var parts []string
	switch {
	case f.Enum != nil:
		parts = append(parts, "one of "+strings.Join(f.Enum, "|"))
	case f.Format != "":
		parts = append(parts, string(f.Type)+" ("+f.Format+")")
	default:
		parts = append(parts, string(f.Type))
	}
	if f.Required {
		parts = append(parts, "required")
	}
	if f.Minimum != nil {
		parts = append(parts, fmt.Sprintf("at least %g", *f.Minimum))
	}
	if f.Maximum != nil {
		parts = append(parts, fmt.Sprintf("at most %g", *f.Maximum))
	}
	if f.Default != nil {
		parts = append(parts, fmt.Sprintf("default %v", f.Default))
	}
	help := strings.Join(parts, ", ")
	if t := firstOf(f.Title, f.Description); t != "" {
		help += ": " + t
	}
	return safe(help)
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

func (p *Program) jobsAnswerCmd(cfg *Config) *cobra.Command {
	var decline, cancel bool
	cmd := &cobra.Command{
		Use:   "answer ID QUESTION [FIELD=VALUE...] [flags]",
		Short: "Answer a question a job asks",
		Long: `Answer a question a job asks: accept its form with the values given as
FIELD=VALUE (numbers and true/false for the fields that are numbers and
booleans; the defaults fill in what is left out), or --decline it, or
--cancel (dismiss) it. "delegate jobs questions ID" shows the fields. The
answer reaches the job wherever it runs: the server running it reads it.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return exactArgs("ID", "QUESTION")(cmd, args)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			jobID, qid, values := args[0], args[1], args[2:]
			a := delegate.Answer{Action: delegate.AnswerAccept, By: "cli"}
			switch {
			case decline && cancel:
				return usagef("--decline and --cancel: give one")
			case (decline || cancel) && len(values) > 0:
				return usagef("unexpected argument %q: a declined or cancelled question takes no values", values[0])
			case decline:
				a.Action = delegate.AnswerDecline
			case cancel:
				a.Action = delegate.AnswerCancel
			}
			return p.withQuestions(ctx, *cfg, func(qs delegate.QuestionService) error {
				if a.Action == delegate.AnswerAccept {
					list, err := qs.Questions(ctx, jobID)
					if err != nil {
						return err
					}
					var form delegate.Form
					for _, q := range list {
						if q.ID == qid {
							form = q.Form
						}
					}
					if a.Content, err = contentOf(form, values); err != nil {
						return err
					}
				}
				q, err := qs.Answer(ctx, jobID, qid, a)
				var fe *delegate.FieldError
				if errors.As(err, &fe) {
					return usagef("%s: %s", strings.TrimPrefix(fe.Field, "content."), fe.Rule)
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(p.Stdout, "%s %s: %s\n", jobID, q.ID, q.Answer.Action)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&decline, "decline", false, "decline the question")
	cmd.Flags().BoolVar(&cancel, "cancel", false, "dismiss the question without an answer")
	return cmd
}

// contentOf reads FIELD=VALUE arguments as the values of form's fields.
// A field the form does not have is passed on as text, for the service
// to name it.
func contentOf(form delegate.Form, values []string) (map[string]any, error) {
	content := map[string]any{}
	for _, arg := range values {
		name, value, ok := strings.Cut(arg, "=")
		if !ok || name == "" {
			return nil, usagef("%q: give FIELD=VALUE", arg)
		}
		if _, dup := content[name]; dup {
			return nil, usagef("%s: given twice", name)
		}
		var typ delegate.FieldType
		for _, f := range form.Fields {
			if f.Name == name {
				typ = f.Type
			}
		}
		switch typ {
		case delegate.FieldNumber, delegate.FieldInteger:
			n, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return nil, usagef("%s: must be a number (got %q)", name, value)
			}
			content[name] = n
		case delegate.FieldBoolean:
			b, err := strconv.ParseBool(value)
			if err != nil {
				return nil, usagef("%s: must be true or false (got %q)", name, value)
			}
			content[name] = b
		default:
			content[name] = value
		}
	}
	return content, nil
}
