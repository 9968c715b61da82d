package dashboard

import "net/http"

// changesPages serve what a job changed in its workspace besides its
// page's Changes section (readJob): the patch, with the dashboard's
// answers.
type changesPages struct{ *dash }

func (d *changesPages) addRoutes(mux *http.ServeMux) {
	mux.Handle("GET /jobs/{id}/patch", d.guard(d.patch))
}

// patch serves a job's workspace changes as a patch for git apply.
func (d *changesPages) patch(w http.ResponseWriter, r *http.Request) {
	ws := d.ws
	if ws == nil {
		d.fail(w, r, http.StatusNotFound, "This server keeps no workspaces.")
		return
	}
	data, err := ws.Patch(r.Context(), r.PathValue("id"))
	if err != nil {
		d.serviceError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/x-diff; charset=utf-8")
	w.Header().Set("Content-Disposition", attachment(r.PathValue("id")+".patch"))
	w.Write(data)
}
