# Tether — build, test and demo targets. `make test` is what CI runs.
GO ?= go
GOFLAGS ?=
SHELL := /bin/bash
PKGS := ./...

.PHONY: test test-short check fmt vet bench soak demo clean fuzz mutants explore deps help

## test: formatting, vet, then every test (purity check, scenarios, determinism, …);
## the adapters and the binaries (the code with goroutines) under the race detector;
## the simulator's and the explorer's summary lines are shown (go test hides a passing
## package's output)
test: check
	$(GO) test $(GOFLAGS) -count=1 $$($(GO) list ./... | grep -v -E "/(sim|spec)$$|^$$($(GO) list -m)/(adapters|cmd)/")
	$(GO) test $(GOFLAGS) -race -count=1 -timeout 30m ./adapters/... ./cmd/...
	@set -o pipefail; $(GO) test $(GOFLAGS) -count=1 -timeout 30m -v -run . ./spec ./sim > .sim-test.log 2>&1 \
	  && { grep -E '^(sim:|explore [a-z]+:|--- PASS: Test(Sim|Explore|Replay)|ok )' .sim-test.log; rm -f .sim-test.log; } \
	  || { cat .sim-test.log; rm -f .sim-test.log; exit 1; }

## deps: what make test needs beyond Go and make, from Debian (apt-get; needs root or
## sudo), each only when missing: chromium, which the status page's browser test drives
## (adapters/orchestrator/browser_test.go; TETHER_CHROMIUM names another browser,
## TETHER_SKIP_BROWSER=1 skips that test), and postgresql, whose initdb and pg_ctl (on
## PATH or under /usr/lib/postgresql/*/bin) start the private clusters of the PostgreSQL
## tests (adapters/pgtest; TETHER_TEST_PG=off skips those tests, which otherwise fail
## without them)
PGLIB ?= /usr/lib/postgresql
deps:
	@pkgs=; \
	if command -v chromium >/dev/null; then echo "chromium: $$(command -v chromium)"; else pkgs="$$pkgs chromium"; fi; \
	pg=; for d in $$(command -v initdb | xargs -r dirname) $$(ls -d $(PGLIB)/*/bin 2>/dev/null | sort -rV); do \
	  [ -x "$$d/initdb" ] && [ -x "$$d/pg_ctl" ] && { pg=$$d; break; }; done; \
	if [ -n "$$pg" ]; then echo "postgresql: $$pg"; else pkgs="$$pkgs postgresql"; fi; \
	[ -z "$$pkgs" ] || { \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$pkgs; }

## test-short: the same with reduced seed budgets
test-short: check
	$(GO) test $(GOFLAGS) -short -count=1 $(PKGS)

## check: gofmt and go vet must be clean
check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt: not formatted:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

## fmt: gofmt every Go file in place
fmt:
	gofmt -w $$(git ls-files '*.go')

## vet: go vet alone
vet:
	$(GO) vet $(PKGS)

## bench: every figure of the performance targets in one run (5–6 minutes), each pass's
## output kept in .bench/, then the summary (bench/report): figure, target, measured, met
## or MISSED, and the ratios to the peers measured in the same run. The passes: the
## micro-benchmarks; BenchmarkEndToEnd on bbolt (real fsyncs, 4 worker processes: 64 and
## 4 slots, the loop's longest batch, submit → start on an idle system; BENCHCOUNT repeats
## it); the same on PostgreSQL with River beside it on the same cluster, its jobs inserted
## 200 per InsertMany and one per Insert (issue 16's 5× point is judged against the
## latter, the shape it measured River in) (STORE: postgres, a
## private cluster (adapters/pgtest), the default; a postgres:// URL, that server; off,
## no PostgreSQL pass); BenchmarkIdleWorkers (10,000 idle workers); the simulator's
## seeds/s per core and the explorer's states/s (BenchmarkSimSeeds at -cpu 1,
## BenchmarkExplore at -cpu 1 and at every core, one go test each: given -cpu 1,2, go test
## reports a benchmark slower than -benchtime at its first GOMAXPROCS from a run at its last).
## BENCH_PEERS=1 adds asynq (bench/peers/asynq, on private Redis servers: no fsync, and
## appendfsync always) beside the bbolt figures, and River too when STORE=off; it installs
## Debian's redis-server when it is missing (apt-get; needs root or sudo)
BENCHCOUNT ?= 1
STORE ?= postgres
BENCH_PEERS ?=
BENCHOUT := .bench
bench:
	@if [ -n "$(BENCH_PEERS)" ] && ! command -v redis-server >/dev/null; then \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; fi
	@mkdir -p $(BENCHOUT); rm -f $(BENCHOUT)/*.out; set -o pipefail; rc=0; \
	peers='$(BENCH_PEERS)'; pg='$(STORE)'; case "$$pg" in ""|off|bbolt) pg=;; esac; \
	[ -z "$$peers" ] || [ -z "$$pg" ] || peers=asynq; \
	$(GO) test -run '^$$' -bench . -skip 'EndToEnd|IdleWorkers|SimSeeds|Explore' -benchmem $(PKGS) \
	  | tee $(BENCHOUT)/micro.out || rc=1; \
	TETHER_BENCH_STORE=bbolt BENCH_PEERS="$$peers" $(GO) test -run '^$$' -bench EndToEnd -benchtime 1x \
	  -count $(BENCHCOUNT) -timeout 60m ./adapters/orchestrator | tee $(BENCHOUT)/bbolt.out || rc=1; \
	[ -z "$$pg" ] || TETHER_BENCH_STORE="$$pg" BENCH_PEERS= $(GO) test -run '^$$' -bench EndToEnd -benchtime 1x \
	  -count $(BENCHCOUNT) -timeout 60m ./adapters/orchestrator | tee $(BENCHOUT)/postgres.out || rc=1; \
	$(GO) test -run '^$$' -bench IdleWorkers -benchtime 1x -timeout 30m ./adapters/orchestrator \
	  | tee $(BENCHOUT)/idle.out || rc=1; \
	$(GO) test -run '^$$' -bench '^BenchmarkSimSeeds$$' -cpu 1 -timeout 30m ./sim | tee $(BENCHOUT)/sim.out || rc=1; \
	for cpu in 1 $$(nproc); do $(GO) test -run '^$$' -bench '^BenchmarkExplore$$' -cpu $$cpu -timeout 30m ./spec \
	  | tee -a $(BENCHOUT)/explore.out || rc=1; done; \
	$(GO) run ./bench/report $(BENCHOUT)/micro.out $(BENCHOUT)/bbolt.out $(BENCHOUT)/idle.out \
	  $(BENCHOUT)/sim.out $(BENCHOUT)/explore.out \
	  $$([ -z "$$pg" ] || echo postgres=$(BENCHOUT)/postgres.out) || rc=1; \
	exit $$rc

## soak: the soak (cmd/soak): 1,000,000 no-op steps through the orchestrator binary and 4
## worker processes, a line per 100,000 (RSS, peak RSS, store size, steps/s), the restart
## (time to serving, RSS after), then 10 minutes under serve --retain 1m (store size over
## time; skipped, saying so, by a binary without --retain); a verdict line per threshold,
## exit 1 on a FAIL or a failed run. SOAKFLAGS passes flags: SOAKFLAGS='-steps 200000'.
## make test runs it at 2,000 steps (TestSoakSmall), without judging the figures.
SOAKFLAGS ?=
soak:
	$(GO) run ./cmd/soak $(SOAKFLAGS)

## demo: run Tether for real on loopback with a bbolt file in a temp dir
demo:
	$(GO) run ./cmd/demo

## explore: the explorer over the large scope (depth-first on every core; 2 disconnects, worker and
## orchestrator crashes, cancel, revoke; stops at its state or time budget and says so).
## `go test ./spec` (inside make test) explores the default scope to its own depth and
## every other scope but large to a smaller depth (TestExploreScopes), each required to
## show its sometimes properties; `make explore EXPLORESCOPE=timers` explores another
## scope to its own depth (the scopes: spec.ScopeNames, listed in the README).
EXPLOREFLAGS ?=
EXPLORESCOPE ?= large
explore:
	$(GO) test ./spec -run '^TestExplore$$' -count=1 -v -timeout 0 -explore.scope=$(EXPLORESCOPE) -explore.progress $(EXPLOREFLAGS)

## mutants: apply each planted bug in sim/mutants/*.patch to a copy of the tree; the simulator must catch every one
mutants:
	$(GO) run ./sim/mutants/run

## clean: forget cached test results
clean:
	$(GO) clean -testcache

FUZZTIME ?= 30s
# Every fuzz target, as package:Target; each decodes bytes that arrive at a socket
# or from the store (SPEC §12). FuzzInputStream minimizes by count (its inputs are slow).
FUZZ_TARGETS ?= ./fuzz:FuzzRestore ./fuzz:FuzzRecordRoundTrip ./fuzz:FuzzRunSpec ./fuzz:FuzzWorkflow \
	./fuzz:FuzzInputStream ./fuzz:FuzzHelloFrame ./fuzz:FuzzWorkerFrames \
	./adapters/wire:FuzzDecode ./adapters/orchestrator:FuzzParseDataPath \
	./adapters/orchestrator:FuzzAPIRequest ./adapters/orchestrator:FuzzDataPlaneHeaders \
	./adapters/worker:FuzzStepEndpoint

## fuzz: each fuzz target in turn for FUZZTIME (make test already replays the corpora);
## new failures land in <pkg>/testdata/fuzz/<Target>/
fuzz:
	@set -e; for pt in $(FUZZ_TARGETS); do \
	  p=$${pt%%:*}; t=$${pt##*:}; \
	  min=10s; [ $$t = FuzzInputStream ] && min=100x; \
	  echo "== $$p $$t"; \
	  $(GO) test $$p -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $$min; \
	done

## help: this list: each target with its "## target: text" comment above
help:
	@awk '/^## [a-z-]+:/ { t = $$2; sub(/:$$/, "", t); sub(/^## [a-z-]+: */, ""); printf "%-11s %s\n", t, $$0; next } \
	  /^## / && t != "" { sub(/^## /, ""); printf "%-11s %s\n", "", $$0; next } { t = "" }' $(firstword $(MAKEFILE_LIST))
