package orchestrator_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/tether-run/tether/adapters/orchestrator"
	"github.com/tether-run/tether/core"
)

// TestSubmitParent: POST /api/runs?parent= makes a child run of a live run
// (SPEC §2): an unknown parent is 404, a finished or full one 409; an inline child
// workflow is accepted and a file path refused 400; GET /api/runs/{id}
// shows the tree, and the status page links parent and children (§18).
func TestSubmitParent(t *testing.T) {
	r := startAPI(t)
	held := []byte("steps:\n  - name: a\n    hold: true\n    run: echo x\n")
	var parent, child orchestrator.APISubmitted
	r.expect("POST", "/runs", held, http.StatusCreated, &parent)
	r.expect("POST", "/runs?parent="+parent.Run, held, http.StatusCreated, &child)
	r.expect("POST", "/runs?parent=run-99", held, http.StatusNotFound, nil)
	var det orchestrator.APIRunDetail
	r.expect("GET", "/runs/"+parent.Run, nil, http.StatusOK, &det)
	if len(det.Children) != 1 || det.Children[0] != child.Run {
		t.Fatalf("parent's children: %v, want [%s]", det.Children, child.Run)
	}
	r.expect("GET", "/runs/"+child.Run, nil, http.StatusOK, &det)
	if det.Run.Parent != parent.Run || det.ParentStep != "" {
		t.Fatalf("child: parent %q, parent step %q", det.Run.Parent, det.ParentStep)
	}
	// A full parent refuses a 65th child with 409, as a finished one does
	// (SPEC §12): its state refuses the run, not the run itself.
	var full orchestrator.APISubmitted
	r.expect("POST", "/runs", held, http.StatusCreated, &full)
	for range core.MaxChildRuns {
		r.expect("POST", "/runs?parent="+full.Run, held, http.StatusCreated, nil)
	}
	r.expect("POST", "/runs?parent="+full.Run, held, http.StatusConflict, nil)

	wc := newWebClient(t, r)
	wc.login(adminToken)
	if a := wc.do("GET", "/runs/"+parent.Run, nil, nil); !strings.Contains(a.body, `<a class="child" href="/runs/`+child.Run+`">`) {
		t.Errorf("the parent's page does not link its child:\n%.2000s", a.body)
	}
	if a := wc.do("GET", "/runs/"+child.Run, nil, nil); !strings.Contains(a.body, `<a class="parent" href="/runs/`+parent.Run+`">`) {
		t.Errorf("the child's page does not link its parent")
	}

	r.expect("POST", "/runs/"+parent.Run+"/cancel", nil, http.StatusOK, nil)
	r.expect("GET", "/runs/"+child.Run, nil, http.StatusOK, &det)
	if det.Status != "cancelled" {
		t.Errorf("the child of a cancelled run is %s", det.Status)
	}
	r.expect("POST", "/runs?parent="+parent.Run, held, http.StatusConflict, nil)

	inline := []byte("steps:\n  - name: sub\n    hold: true\n    workflow:\n      steps:\n        - name: k\n          run: echo k\n    with: {K: v}\n")
	r.expect("POST", "/runs", inline, http.StatusCreated, nil)
	r.expect("POST", "/runs", []byte("steps:\n  - name: sub\n    workflow: sub.yaml\n"), http.StatusBadRequest, nil)
}
