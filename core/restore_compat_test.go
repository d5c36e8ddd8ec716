package core

import (
	"encoding/hex"
	"strings"
	"testing"
	"time"
)

// storeOfFb9fc3a is every record of an orchestrator of commit fb9fc3a (step
// and run timeouts still sweep phases, no dispatch-ack exclusions): worker
// w1 enrolled with entropy {2}; run-1 (timeout 100s) submitted at t0 with a
// (timeout 30s, started at +5s under lease 1) and b (held).
const storeOfFb9fc3a = `event/run-1/00000001	{"Run":"run-1","Seq":1,"At":"2026-01-01T00:00:00Z","Step":"","Kind":"run-submitted","Message":"run submitted with 2 steps"}
event/run-1/00000002	{"Run":"run-1","Seq":2,"At":"2026-01-01T00:00:00Z","Step":"run-1/b","Kind":"step-held","Message":"waiting for an operator's approval"}
lease/00000000000000000001	{"ID":1,"Step":"run-1/a","Worker":"w1","GrantedAt":"2026-01-01T00:00:00Z","Current":true,"Started":true,"Committed":false}
meta	{"RunSeq":1,"LeaseSeq":1,"NextSweep":"2026-01-01T00:01:00Z"}
run/run-1	{"ID":"run-1","Spec":{"Name":"r","Timeout":100000000000,"Env":null,"Steps":[{"Name":"a","Command":"sleep 60","DependsOn":null,"Writes":false,"Type":"","Runner":"","Tags":null,"Labels":null,"Target":"","Platform":"","Timeout":30000000000,"Env":null,"ForEach":null,"Concurrency":0,"Hold":false,"HoldExpiry":0,"Wait":0},{"Name":"b","Command":"true","DependsOn":null,"Writes":false,"Type":"","Runner":"","Tags":null,"Labels":null,"Target":"","Platform":"","Timeout":0,"Env":null,"ForEach":null,"Concurrency":0,"Hold":true,"HoldExpiry":0,"Wait":0}]},"SubmittedAt":"2026-01-01T00:00:00Z","Deadline":"2026-01-01T00:01:40Z","CancelClass":"","Steps":["run-1/a","run-1/b"],"Failed":false,"Finished":false}
step/run-1/a	{"ID":"run-1/a","Run":"run-1","Name":"a","Index":-1,"Deps":null,"State":2,"Attempts":1,"Lease":1,"QueuedAt":"2026-01-01T00:00:00Z","StartedAt":"2026-01-01T00:00:05Z","EverStarted":true}
step/run-1/b	{"ID":"run-1/b","Run":"run-1","Name":"b","Index":-1,"Deps":null,"State":5,"Attempts":0,"Lease":0,"EverStarted":false}
token/tok	{"Name":"tok","Hash":[180,230,125,172,178,125,84,152,2,170,162,112,41,218,89,184,248,119,223,29,147,144,150,240,189,92,213,185,255,13,34,102],"CreatedAt":"2026-01-01T00:00:00Z","ExpiresAt":"2026-01-01T01:00:00Z","Consumed":true,"Worker":"w1","Revoked":false}
worker/w1	{"ID":"w1","Name":"w1","Token":"tok","Slots":2,"Scaler":false,"Grace":120000000000,"Active":true,"Revoked":false,"CredHash":[16,240,25,12,165,210,207,48,3,32,170,132,38,182,227,49,53,233,50,108,145,59,186,123,92,44,233,114,15,109,63,205],"CredExpiry":"2026-01-01T00:15:00Z","LastHeartbeat":"2026-01-01T00:00:00Z","EnrolledAt":"2026-01-01T00:00:00Z"}
`

// TestRestoreStoreOfFb9fc3a: a store written before the timeout timers and
// the MissedBy field restores (new fields take their zero values), and the
// restored machine re-arms both timeouts for their full windows from the
// restore at +10s, later than the records' deadlines (SPEC §5, §7: a restore
// never shortens a window): a reclaims under its old lease and fails
// step-timeout at exactly +40s (not START +35s); the run is cancelled
// run-timeout at exactly +110s (not submit +100s).
func TestRestoreStoreOfFb9fc3a(t *testing.T) {
	var recs []Record
	for _, line := range strings.Split(strings.TrimSpace(storeOfFb9fc3a), "\n") {
		k, v, _ := strings.Cut(line, "\t")
		recs = append(recs, Record{Key: k, Value: []byte(v)})
	}
	o, _, err := Restore(DefaultConfig(), t0.Add(10*time.Second), recs)
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := o.StepByID("run-1/a"); s.State != StateRecovering || s.MissedBy != nil {
		t.Fatalf("restored a: %s, missed by %v; want recovering, no exclusion", s.State, s.MissedBy)
	}
	var entropy [16]byte
	entropy[0] = 2
	cred := "w1." + hex.EncodeToString(entropy[:])
	rd := o.Step(t0.Add(10*time.Second), Received{Conn: 7, Msg: Hello{Version: ProtocolVersion, Credential: cred, Worker: "w1", Slots: 2,
		MaxDelay: time.Minute, InFlight: []LeaseRef{{Step: "run-1/a", Lease: 1}}}})
	if s, _ := o.StepByID("run-1/a"); s.State != StateRunning {
		t.Fatalf("a is %s after w1's reconnect, want running (reclaimed): %v", s.State, DescribeReady(rd, t0, func(ConnID) string { return "w1" }))
	}
	if want := t0.Add(40 * time.Second); !rd.Deadline.Equal(want) {
		t.Errorf("next deadline after the reclaim: %s, want a's timeout at %s", DescribeAt(rd.Deadline, t0), DescribeAt(want, t0))
	}
	o.Step(t0.Add(39*time.Second), Tick{})
	if s, _ := o.StepByID("run-1/a"); s.State != StateRunning {
		t.Errorf("a at +39s: %s, want running (its window re-armed from the restore)", s.State)
	}
	o.Step(t0.Add(40*time.Second), Tick{})
	if s, _ := o.StepByID("run-1/a"); s.State != StateFailed || s.Class != ClassStepTimeout {
		t.Errorf("a at +40s: %s %s, want failed step-timeout", s.State, s.Class)
	}
	o.Step(t0.Add(109*time.Second), Received{Conn: 7, Msg: Heartbeat{}})
	if r, _, _ := o.Run("run-1"); r.CancelReason != "" {
		t.Fatalf("run-1 cancelled before its deadline: %s", r.CancelReason)
	}
	// The cancelled run finishes and leaves the core in that batch (§7a):
	// b is read from its history record.
	rd = o.Step(t0.Add(110*time.Second), Tick{})
	var hist *RunHistory
	for _, r := range rd.Records {
		if r.Key == HistoryKey("run-1") {
			v, err := DecodeRecord(r)
			if err != nil {
				t.Fatal(err)
			}
			hist = v.(*RunHistory)
		}
	}
	if hist == nil {
		t.Fatal("run-1 finished at +110s but was not archived")
	}
	if s, _ := hist.Step("run-1/b"); s.State != StateCancelled || s.Class != ClassRunTimeout {
		t.Errorf("b at +110s: %s %s, want cancelled run-timeout", s.State, s.Class)
	}
}
