package core

import (
	"errors"
	"fmt"
	"strings"
)

// Declared writes (SPEC §14): a step's Outputs name the data ids it may
// write, each an id or a prefix ending in '*'. The fence refuses a write
// by such a step to any other id (RefusedUndeclaredOutput); a step that
// declares none may write any id.

// MaxOutputs bounds the outputs one step declares.
const MaxOutputs = 64

// maxDataID is the data plane's bound on an id (adapters/store.MaxIDLength).
const maxDataID = 128

// ErrUndeclaredOutput is returned (wrapped) when a step that declares its
// outputs writes an id outside them.
var ErrUndeclaredOutput = errors.New("write outside the step's declared outputs")

// checkOutputs validates a step's Outputs: at most MaxOutputs, each a data
// id (1–128 of [A-Za-z0-9._-], the first a letter or digit) or such a
// prefix, possibly empty, followed by '*'; declaring any needs Writes.
func checkOutputs(s StepSpec) error {
	if len(s.Outputs) == 0 {
		return nil
	}
	if len(s.Outputs) > MaxOutputs {
		return fmt.Errorf("outputs has %d entries, at most %d", len(s.Outputs), MaxOutputs)
	}
	if !s.Writes {
		return fmt.Errorf("outputs declares writes: set writes: true (the workflow parser implies it)")
	}
	for _, o := range s.Outputs {
		id, prefix := strings.CutSuffix(o, "*")
		if prefix && id == "" {
			continue // "*": any id, said explicitly
		}
		if !validDataID(id) {
			return fmt.Errorf("output %s: want a data id (1-%d of [A-Za-z0-9._-], the first a letter or digit) or such a prefix ending in '*'", Quote(o), maxDataID)
		}
	}
	return nil
}

func validDataID(id string) bool {
	if id == "" || len(id) > maxDataID {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return false
		}
	}
	return true
}

// OutputAllowed reports whether a step declaring outputs may write data
// id: no outputs allows every id.
func OutputAllowed(outputs []string, id string) bool {
	if len(outputs) == 0 {
		return true
	}
	for _, o := range outputs {
		if p, ok := strings.CutSuffix(o, "*"); ok {
			if strings.HasPrefix(id, p) {
				return true
			}
		} else if o == id {
			return true
		}
	}
	return false
}

// output is the declared-writes half of the fence: whether the step of
// current lease l may write data id ("" asks nothing: a read, or a write
// that names no id).
func (o *Orchestrator) output(l LeaseID, id string) (WriteRefusal, string) {
	if id == "" {
		return WriteAdmitted, ""
	}
	lr := o.leases[l]
	if lr == nil {
		return WriteAdmitted, ""
	}
	sp := o.specOf[lr.Step]
	if sp == nil || OutputAllowed(sp.Outputs, id) {
		return WriteAdmitted, ""
	}
	return RefusedUndeclaredOutput, fmt.Sprintf("step %s declares outputs %s, not %s", lr.Step, ListForError(sp.Outputs), Quote(id))
}
