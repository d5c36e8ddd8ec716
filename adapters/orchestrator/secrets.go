package orchestrator

// Secrets (SPEC §14a): the operator API's /api/secrets routes and the data
// plane's /secret/{name}, for a step's lease.
//
//	GET /secret/{name}  → 200, the raw value: only under a current lease whose step lists name in secrets:
//	PUT /secret/{name}  body: the value → 201 {"name", "size", ...}: only for a name in put_secrets:, fenced like a data write
//
// The core decides every change with its audit entry and every step's
// access (core/secrets.go); the value rides the group's transaction as a
// store op (store.OpSecretPut), the way a data write's bytes do (SPEC
// §14), sealed by the store with the secrets key (store/secrets.go). The
// value is never in a core record, a log line of the orchestrator or an
// answer but GET /secret/{name}'s.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/tether-run/tether/adapters/store"
	"github.com/tether-run/tether/client"
	"github.com/tether-run/tether/core"
)

var (
	// ErrSecretRefused wraps the core's refusal of a step's secret read or
	// write for a name its step does not declare (403).
	ErrSecretRefused = errors.New("secret refused")
	// ErrNoSecrets is returned when the store keeps no secrets (503).
	ErrNoSecrets = errors.New("orchestrator: this store keeps no secrets (no secrets key)")
)

// admitSecret has the core decide a change of a secret at its place among
// the group's inputs (loop goroutine): an operator's call (answered with
// its audit entry) or a step's write (fenced like a data write).
func (d *Driver) admitSecret(in *dataWrite, step func(core.Input) core.Ready) error {
	var call core.CallID
	switch c := in.call.(type) {
	case core.PutSecret:
		call = c.Call
	case core.RemoveSecret:
		call = c.Call
	case core.CreateToken:
		call = c.Call
	}
	switch c := in.call.(type) {
	case core.PutSecret, core.RemoveSecret, core.CreateToken:
		rd := step(c)
		in.op.At = d.o.Now()
		for _, a := range rd.Answers {
			if a.Call == call && a.Err != "" {
				return &httpError{code: codeStatus(a.Code), msg: a.Err}
			}
		}
		return nil
	case core.SecretWrite:
		rd := step(c)
		in.op.At = d.o.Now()
		if len(rd.Writes) != 1 {
			return fmt.Errorf("%w: the core answered %d writes for one", ErrFenced, len(rd.Writes))
		}
		return dataRefusal(rd.Writes[0])
	}
	return fmt.Errorf("orchestrator: a secret op without its core input (%T)", in.call)
}

// codeStatus is the status of a core refusal's code (SPEC §15).
func codeStatus(code string) int {
	switch code {
	case core.CodeInvalid:
		return http.StatusBadRequest
	case core.CodeNotFound:
		return http.StatusNotFound
	case core.CodeForbidden:
		return http.StatusForbidden
	}
	return http.StatusConflict
}

// changeSecret has the loop decide in (a core.PutSecret, RemoveSecret or
// SecretWrite) and, admitted, apply op with its group; it returns once
// durable or refused.
func (d *Driver) changeSecret(ctx context.Context, in core.Input, op store.DataOp) error {
	if !d.secrets {
		return ErrNoSecrets
	}
	reply := make(chan dataAnswer, 1)
	if err := d.push(ctx, dataWrite{op: op, call: in, reply: reply}); err != nil {
		return err
	}
	select {
	case a, ok := <-reply:
		if !ok {
			return ErrClosed
		}
		noted(ctx) // the core audited it, accepted or refused
		if a.err != nil {
			return a.err
		}
		return a.res.Err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// PutSecret stores value as secret name for an operator (audited
// secret.put); it returns once durable.
func (d *Driver) PutSecret(ctx context.Context, name string, value []byte) error {
	in := core.PutSecret{Call: core.CallID(d.nextCall.Add(1)), Actor: actorOf(ctx), Name: name, Size: len(value)}
	return d.changeSecret(ctx, in, store.DataOp{Kind: store.OpSecretPut, ID: name, Body: value})
}

// RemoveSecret removes secret name (audited secret.rm).
func (d *Driver) RemoveSecret(ctx context.Context, name string) error {
	in := core.RemoveSecret{Call: core.CallID(d.nextCall.Add(1)), Actor: actorOf(ctx), Name: name}
	return d.changeSecret(ctx, in, store.DataOp{Kind: store.OpSecretDelete, ID: name})
}

// openSecrets gives the store its secrets key (Options.SecretsKeyFile,
// SecretsKey, or the file next to the store, created on first start).
func (d *Driver) openSecrets(opts Options) error {
	key := opts.SecretsKey
	path := opts.SecretsKeyFile
	if path == "" && key == nil && opts.StorePath != "" {
		path = opts.StorePath + ".secrets-key"
	}
	if path != "" {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			// Asked only when the key would be made: a store that
			// cannot say (a database that went away) makes no key.
			sealed, err := d.st.HoldsSealed()
			if err != nil {
				return fmt.Errorf("secrets key file %s does not exist, and whether the store holds values sealed with a key cannot be read: %w", path, err)
			}
			if sealed {
				return fmt.Errorf("%w: the secrets key file %s does not exist, and the store holds values sealed with a key: "+
					"put that key file there (a backup does not carry it) or name it with --secrets-key-file; a new key would open none of them", store.ErrNoSecretsKey, path)
			}
		}
		k, created, err := store.LoadOrCreateKey(path)
		if err != nil {
			return err
		}
		if created {
			d.log.Info("secrets key created", "path", path)
		}
		key = k
	}
	if key == nil {
		return nil
	}
	if err := d.st.SetSecretsKey(key); err != nil {
		return err
	}
	d.secrets = true
	return nil
}

// ---- the operator API ----

func (a *api) putSecret(r *http.Request) (int, any, error) {
	name := r.PathValue("name")
	if err := core.CheckSecretName(name); err != nil {
		return 0, nil, errorf(http.StatusBadRequest, "%v", err)
	}
	value, err := readBody(r)
	if err != nil {
		return 0, nil, err
	}
	if err := a.d.PutSecret(r.Context(), name, value); err != nil {
		return 0, nil, err
	}
	return a.showSecret(r.Context(), name)
}

func (a *api) showSecret(ctx context.Context, name string) (int, any, error) {
	var out client.Secret
	err := a.d.Snapshot(ctx, func(o *core.Orchestrator) {
		for _, s := range o.Secrets() {
			if s.Name == name {
				out = client.Secret{Name: s.Name, Size: s.Size, UpdatedAt: s.UpdatedAt, UpdatedBy: s.UpdatedBy}
			}
		}
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}

func (a *api) listSecrets(r *http.Request) (int, any, error) {
	out := client.SecretList{Secrets: []client.Secret{}}
	err := a.d.Snapshot(r.Context(), func(o *core.Orchestrator) {
		for _, s := range o.Secrets() {
			out.Secrets = append(out.Secrets, client.Secret{Name: s.Name, Size: s.Size, UpdatedAt: s.UpdatedAt, UpdatedBy: s.UpdatedBy})
		}
	})
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, out, nil
}

func (a *api) removeSecret(r *http.Request) (int, any, error) {
	name := r.PathValue("name")
	if err := a.d.RemoveSecret(r.Context(), name); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, client.RemovedSecret{Removed: name}, nil
}

// ---- the data plane ----

// secret serves GET and PUT /secret/{name} under the request's lease.
func (p *dataPlane) secret(w http.ResponseWriter, r *http.Request, cred string) error {
	name := strings.TrimPrefix(r.URL.Path, "/secret/")
	put := r.Method == http.MethodPut
	switch {
	case !put && r.Method != http.MethodGet:
		return &httpError{code: http.StatusMethodNotAllowed, msg: fmt.Sprintf("method %s is not allowed on %s (allowed: GET, PUT)", r.Method, core.Quote(r.URL.Path)), allow: "GET, PUT"}
	case core.CheckSecretName(name) != nil:
		return &httpError{code: http.StatusBadRequest, msg: core.CheckSecretName(name).Error()}
	}
	ss := p.d.st
	if !p.d.secrets {
		return ErrNoSecrets
	}
	lease, err := parseLease(r)
	if err != nil {
		return &httpError{code: http.StatusBadRequest, msg: strings.Replace(err.Error(), "a write", "a secret", 1)}
	}
	// Asked of the state the last durable batch left: the credential, the
	// lease (current, the worker's) and the step's declaration.
	if err := p.checkSecret(r.Context(), cred, lease, name, put); err != nil {
		return err
	}
	if !put {
		v, err := ss.Secret(name)
		if err != nil {
			return err
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		w.Write(v)
		return nil
	}
	// Within the budget of bodies held at once, as an append's (SPEC §14).
	value, held, err := p.readBody(w, r, core.MaxSecretBytes)
	if err != nil {
		return err
	}
	defer p.mem.release(held)
	if len(value) == 0 {
		return &httpError{code: http.StatusBadRequest, msg: "a secret's value must not be empty"}
	}
	in := core.SecretWrite{Credential: cred, Lease: lease, Name: name, Size: len(value)}
	op := store.DataOp{Kind: store.OpSecretPut, ID: name, Body: value, Lease: uint64(lease)}
	if err := p.d.changeSecret(r.Context(), in, op); err != nil {
		return err
	}
	// Answered with the record the core keeps (SPEC §14a: by "step <id>",
	// at the core's time), as the operator's put is (showSecret).
	var out client.Secret
	if err := p.d.Snapshot(r.Context(), func(o *core.Orchestrator) {
		for _, s := range o.Secrets() {
			if s.Name == name {
				out = client.Secret{Name: s.Name, Size: s.Size, UpdatedAt: s.UpdatedAt, UpdatedBy: s.UpdatedBy}
			}
		}
	}); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// token serves POST /token {"name", "ttl", "into_secret"} under the
// request's lease: a step mints an enrollment token straight into a secret
// its step declares in put_secrets: (SPEC §14a), for a later step to start
// a worker with. The token is never answered; 201 {"name", "into_secret",
// "expires"}.
func (p *dataPlane) token(w http.ResponseWriter, r *http.Request, cred string) error {
	if r.Method != http.MethodPost {
		return &httpError{code: http.StatusMethodNotAllowed, msg: fmt.Sprintf("method %s is not allowed on /token (allowed: POST)", r.Method), allow: "POST"}
	}
	if !p.d.secrets {
		return ErrNoSecrets
	}
	lease, err := parseLease(r)
	if err != nil {
		return &httpError{code: http.StatusBadRequest, msg: strings.Replace(err.Error(), "a write", "a token", 1)}
	}
	// A write's credential and lease are checked on its headers, before a
	// byte of its body is read (SPEC §12); the secret it names, below.
	if err := p.d.authenticate(r.Context(), cred, lease); err != nil {
		return err
	}
	var req client.TokenRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxTokenRequestBytes)).Decode(&req); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) || errors.Is(err, ErrBodyStalled) {
			return bodyError(err, maxTokenRequestBytes)
		}
		return &httpError{code: http.StatusBadRequest, msg: `want {"name": "worker-1", "ttl": "10m", "into_secret": "NAME"}: ` + err.Error()}
	}
	if req.Name == "" || req.IntoSecret == "" {
		return &httpError{code: http.StatusBadRequest, msg: `a step's token needs a name and the secret to store it in: {"name": "worker-1", "into_secret": "POOL_TOKEN"}`}
	}
	ttl := DefaultTokenTTL
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d <= 0 {
			return &httpError{code: http.StatusBadRequest, msg: fmt.Sprintf("ttl %s is not a positive duration like 10m", core.Quote(req.TTL))}
		}
		ttl = d
	}
	// Asked of the state the last durable batch left first, as a secret
	// write is; the core decides again at the token's place in the loop.
	if err := p.checkSecret(r.Context(), cred, lease, req.IntoSecret, true); err != nil {
		return err
	}
	if err := p.d.CreateTokenIntoSecret(r.Context(), req.Name, ttl, req.IntoSecret, cred, lease); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, client.CreatedToken{Name: req.Name, IntoSecret: req.IntoSecret, ExpiresAt: time.Now().Add(ttl).UTC()})
	return nil
}

// maxTokenRequestBytes bounds POST /token's body.
const maxTokenRequestBytes = 4 << 10

// checkSecret has the loop ask CheckSecret of the state the last durable
// batch left (SPEC §14a): the credential, the lease (current, the
// worker's) and the step's declaration of name (put: in put_secrets:).
func (p *dataPlane) checkSecret(ctx context.Context, cred string, lease core.LeaseID, name string, put bool) error {
	reply := make(chan error, 1)
	if err := p.d.push(ctx, precheck{cred: cred, lease: lease, secret: name, put: put, reply: reply}); err != nil {
		return err
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
