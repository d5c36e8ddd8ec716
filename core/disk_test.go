package core

import (
	"reflect"
	"testing"
)

// A Delete removes its key, a later record replaces an earlier one, and
// Records lists the survivors in key order whatever the map's order.
func TestDiskApply(t *testing.T) {
	d := Disk{}
	d.Apply([]Record{{Key: "run/b", Value: []byte("1")}, {Key: "run/a", Value: []byte("2")}, {Key: "run/c", Value: []byte("3")}})
	d.Apply([]Record{{Key: "run/c", Delete: true}, {Key: "run/b", Value: []byte("4")}})
	want := []Record{{Key: "run/a", Value: []byte("2")}, {Key: "run/b", Value: []byte("4")}}
	for range 10 {
		if got := d.Records(); !reflect.DeepEqual(got, want) {
			t.Fatalf("disk holds %+v, want %+v", got, want)
		}
	}
}
