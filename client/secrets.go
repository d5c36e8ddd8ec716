package client

import (
	"bytes"
	"context"
	"net/http"
	"net/url"
	"time"
)

// Secret describes a stored secret (SPEC §14a): never its value.
type Secret struct {
	Name      string    `json:"name"`
	Size      int       `json:"size"`
	UpdatedAt time.Time `json:"updated_at"`
	UpdatedBy string    `json:"updated_by,omitempty"` // an operator token's name, or "step <id>"
}

// SecretList answers GET /api/secrets.
type SecretList struct {
	Secrets []Secret `json:"secrets"`
}

// RemovedSecret answers DELETE /api/secrets/{name}.
type RemovedSecret struct {
	Removed string `json:"removed"`
}

// PutSecret stores value as secret name (replacing its value, if any) and
// returns its description once durable.
func (c *Client) PutSecret(ctx context.Context, name string, value []byte) (*Secret, error) {
	var out Secret
	if err := c.call(ctx, http.MethodPut, "/secrets/"+url.PathEscape(name), bytes.NewReader(value), "application/octet-stream", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Secrets lists the stored secrets: names, sizes and times.
func (c *Client) Secrets(ctx context.Context) (*SecretList, error) {
	var out SecretList
	if err := c.call(ctx, http.MethodGet, "/secrets", nil, "", &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RemoveSecret removes a secret.
func (c *Client) RemoveSecret(ctx context.Context, name string) error {
	var out RemovedSecret
	return c.call(ctx, http.MethodDelete, "/secrets/"+url.PathEscape(name), nil, "", &out)
}
