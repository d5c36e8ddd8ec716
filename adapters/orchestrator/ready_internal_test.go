package orchestrator

import (
	"reflect"
	"testing"

	"github.com/tether-run/tether/core"
)

// TestEmptyReadyCoversEveryField: a batch joins no group only when it holds
// nothing at all (SPEC §11: what it holds would never persist or leave).
// Each slice field of core.Ready, a field added later included, made
// non-empty alone must make the batch not empty.
func TestEmptyReadyCoversEveryField(t *testing.T) {
	if !emptyReady(core.Ready{}) {
		t.Fatal("the zero Ready is not empty")
	}
	typ := reflect.TypeOf(core.Ready{})
	slices := 0
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Type.Kind() != reflect.Slice {
			continue
		}
		slices++
		var rd core.Ready
		reflect.ValueOf(&rd).Elem().Field(i).Set(reflect.MakeSlice(f.Type, 1, 1))
		if emptyReady(rd) {
			t.Errorf("a Ready holding one of %s is taken for empty: it would never persist or leave", f.Name)
		}
	}
	if slices < 8 {
		t.Fatalf("core.Ready has %d slice fields; the check is vacuous", slices)
	}
}
