package httpapi_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/delegate-dev/delegate"
	"github.com/delegate-dev/delegate/httpapi"
	"github.com/delegate-dev/delegate/mock"
)

// The handler over a mock CallbackService: how a request becomes a Report, and
// how the service's answer becomes a status code. (httpapi_test.go runs
// the same endpoints over the real engine.)

func TestCallbackToReport(t *testing.T) {
	seven := 7
	tests := []struct {
		name, kind, body string
		want             delegate.Report
	}{
		{"status", "status", `{"progress":"compiling","percent":40}`, delegate.Report{Kind: delegate.ReportStatus, Progress: "compiling (40%)"}},
		{"status from message", "status", `{"message":"linking"}`, delegate.Report{Kind: delegate.ReportStatus, Progress: "linking"}},
		{"heartbeat", "heartbeat", ``, delegate.Report{Kind: delegate.ReportHeartbeat}},
		{"success", "complete", `{"status":"success","result":"12 passed"}`, delegate.Report{Kind: delegate.ReportComplete, Success: true, Result: "12 passed"}},
		{"output as result", "complete", `{"output":"done"}`, delegate.Report{Kind: delegate.ReportComplete, Success: true, Result: "done"}},
		{"failure", "complete", `{"status":"failed","error":"lint","exit_code":7}`,
			delegate.Report{Kind: delegate.ReportComplete, Error: "lint", ExitCode: &seven}},
		{"success with an exit code", "complete", `{"status":"success","exit_code":7}`,
			delegate.Report{Kind: delegate.ReportComplete, ExitCode: &seven}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got delegate.Report
			var gotID, gotToken string
			svc := &mock.CallbackService{AuthenticateFn: authOK, CallbackFn: func(ctx context.Context, id, token string, r delegate.Report) (*delegate.Job, error) {
				got, gotID, gotToken = r, id, token
				return &delegate.Job{ID: id, Status: delegate.StatusRunning}, nil
			}}
			rec := serve(svc, "POST", "/callback/job-1/"+tc.kind, "dlg_t", tc.body)
			if rec.Code != 200 {
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
			if gotID != "job-1" || gotToken != "dlg_t" || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("the service got %q %q %+v, want %+v", gotID, gotToken, got, tc.want)
			}
		})
	}
}

func TestCallbackStatusFromService(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{nil, 200},
		{delegate.ErrUnauthenticated, 401},
		{delegate.ErrForbidden, 403},
		{fmt.Errorf("job job-1 is success: %w", delegate.ErrTerminal), 409},
		{fmt.Errorf("job job-1 is pending: %w", delegate.ErrInvalidTransition), 409},
		{fmt.Errorf("job job-1: %w", delegate.ErrInvalid), 409},
		{delegate.JobNotFound("job-1"), 404},
		{fmt.Errorf("%w: the store is busy on fire", delegate.ErrUnavailable), 503},
		{fmt.Errorf("disk on fire"), 500},
	}
	for _, tc := range tests {
		svc := &mock.CallbackService{AuthenticateFn: authOK, CallbackFn: func(ctx context.Context, id, token string, r delegate.Report) (*delegate.Job, error) {
			if tc.err != nil {
				return nil, tc.err
			}
			return &delegate.Job{ID: id, Status: delegate.StatusSuccess}, nil
		}}
		rec := serve(svc, "POST", "/callback/job-1/complete", "dlg_t", `{"status":"success"}`)
		if rec.Code != tc.want {
			t.Errorf("%v: %d, want %d", tc.err, rec.Code, tc.want)
		}
		if tc.want >= 500 && strings.Contains(rec.Body.String(), "fire") {
			t.Errorf("an internal error is shown to the job: %s", rec.Body)
		}
	}
}

// authOK is an Authenticate that takes every token.
func authOK(context.Context, string, string) error { return nil }

// TestCallbackRefusedBeforeTheService: what the handler refuses itself
// never reaches Callback (the mock panics if called).
func TestCallbackRefusedBeforeTheService(t *testing.T) {
	svc := &mock.CallbackService{AuthenticateFn: authOK}
	for _, tc := range []struct {
		method, path, token, body string
		want                      int
	}{
		{"POST", "/callback/job-1/status", "", `{}`, 401},
		{"POST", "/callback/job-1/explode", "dlg_t", `{}`, 404},
		{"POST", "/callback/job-1/status", "dlg_t", `{"progress":`, 400},
		{"POST", "/callback/job-1/status", "dlg_t", ``, 400},
		{"POST", "/callback/job-1/status", "dlg_t", `{"job_id":"job-2"}`, 400},
		{"POST", "/callback/job-1/complete", "dlg_t", `{"status":"maybe"}`, 400},
		{"POST", "/callback/job-1/status", "dlg_t", `{"progress":"` + strings.Repeat("x", 2000) + `"}`, 413},
		{"GET", "/callback/job-1/status", "dlg_t", ``, 405},
		{"GET", "/nowhere", "", ``, 404},
		{"GET", "/health", "", ``, 200},
	} {
		rec := serve(svc, tc.method, tc.path, tc.token, tc.body)
		if rec.Code != tc.want || rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s %s %q: %d %s, want %d", tc.method, tc.path, tc.body, rec.Code, rec.Header().Get("Content-Type"), tc.want)
		}
	}
}

func serve(svc delegate.CallbackService, method, path, token, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	httpapi.Handler(servicesOf(svc), httpapi.Options{BodyLimit: 1024}).ServeHTTP(rec, req)
	return rec
}

// servicesOf names the services svc implements (as cmd/ wires the
// engine, which implements them all).
func servicesOf(svc delegate.CallbackService) httpapi.Services {
	qs, _ := svc.(delegate.QuestionService)
	return httpapi.Services{Callbacks: svc, Questions: qs}
}
