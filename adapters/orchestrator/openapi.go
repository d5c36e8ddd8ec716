package orchestrator

// The operator API's OpenAPI 3 description, served at GET /api/openapi.json
// (SPEC §15). It is built from apiRoutes, the table that also registers the
// handlers, and its schemas from the Go types the handlers encode (package
// client), so neither a route nor a field can be documented differently
// from what is served; openapi_test.go holds it against the server's mux.

import (
	"encoding/json"
	"net/http"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/tether-run/tether/client"
)

var pathParam = regexp.MustCompile(`\{([a-z]+)\}`)

// openAPIDocument renders the document of routes.
func openAPIDocument(routes []apiRoute) []byte {
	g := &schemaGen{schemas: map[string]any{}}
	errRef := g.schema(reflect.TypeOf(client.ErrorBody{}))
	paths := map[string]map[string]any{}
	for _, rt := range routes {
		op := map[string]any{
			"summary":     rt.summary,
			"operationId": operationID(rt.method, rt.path),
		}
		var params []any
		for _, m := range pathParam.FindAllStringSubmatch(rt.path, -1) {
			params = append(params, map[string]any{"name": m[1], "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
		}
		for _, q := range rt.query {
			params = append(params, map[string]any{"name": q.name, "in": "query", "description": q.desc, "schema": map[string]any{"type": "string"}})
		}
		if params != nil {
			op["parameters"] = params
		}
		if rt.request != nil {
			op["requestBody"] = map[string]any{"content": g.content(rt.request)}
		}
		status := rt.status
		if status == 0 {
			status = http.StatusOK
		}
		responses := map[string]any{
			strconv.Itoa(status): map[string]any{"description": http.StatusText(status), "content": g.content(rt.answer)},
			"default": map[string]any{
				"description": "an error: its code is one of a closed set (SPEC §15)",
				"content":     map[string]any{"application/json": map[string]any{"schema": errRef}},
			},
		}
		if rt.also200 != "" {
			responses["200"] = map[string]any{"description": rt.also200, "content": g.content(rt.answer)}
		}
		op["responses"] = responses
		if rt.public {
			op["security"] = []any{}
		}
		if paths[rt.path] == nil {
			paths[rt.path] = map[string]any{}
		}
		paths[rt.path][strings.ToLower(rt.method)] = op
	}
	doc := map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{
			"title":       "Tether operator API",
			"version":     "1",
			"description": "The orchestrator's operator API (SPEC §15, §15a). Every route but this document needs an operator token as a bearer credential (the admin token is one); a read-only token may call the GET routes only (403 forbidden otherwise).",
		},
		"security": []any{map[string]any{"adminToken": []any{}}},
		"paths":    paths,
		"components": map[string]any{
			"securitySchemes": map[string]any{"adminToken": map[string]any{"type": "http", "scheme": "bearer"}},
			"schemas":         g.schemas,
		},
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		panic("orchestrator: the OpenAPI document does not encode: " + err.Error())
	}
	return append(b, '\n')
}

// operationID names an operation: "get /api/runs/{id}/logs" → getRunsIdLogs.
func operationID(method, path string) string {
	var b strings.Builder
	b.WriteString(strings.ToLower(method))
	for _, seg := range strings.Split(strings.TrimPrefix(path, "/api/"), "/") {
		seg = strings.Trim(seg, "{}")
		for _, part := range strings.FieldsFunc(seg, func(r rune) bool { return r == '.' || r == '_' }) {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}

// schemaGen derives JSON schemas from Go types by their json tags.
type schemaGen struct {
	schemas map[string]any
}

// content is a body's content map: a string is a media type of bytes, any
// other value the JSON of its type.
func (g *schemaGen) content(v any) map[string]any {
	if mt, ok := v.(string); ok {
		schema := map[string]any{"type": "string", "format": "binary"}
		if mt == "application/json" || mt == "application/yaml" {
			schema = map[string]any{"type": "string"}
			if mt == "application/json" {
				schema = map[string]any{"type": "object"}
			}
		}
		return map[string]any{mt: map[string]any{"schema": schema}}
	}
	return map[string]any{"application/json": map[string]any{"schema": g.schema(reflect.TypeOf(v))}}
}

var (
	timeType = reflect.TypeOf(time.Time{})
	codeType = reflect.TypeOf(client.Code(""))
)

func (g *schemaGen) schema(t reflect.Type) map[string]any {
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t == codeType:
		return map[string]any{"type": "string", "enum": client.Codes}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return g.schema(t.Elem())
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice, reflect.Array:
		return map[string]any{"type": "array", "items": g.schema(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": g.schema(t.Elem())}
	case reflect.Struct:
		ref := map[string]any{"$ref": "#/components/schemas/" + t.Name()}
		if _, done := g.schemas[t.Name()]; done {
			return ref
		}
		g.schemas[t.Name()] = nil // a recursive type refers to itself
		props := map[string]any{}
		required := []string{}
		for i := range t.NumField() {
			f := t.Field(i)
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			props[name] = g.schema(f.Type)
			if !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") {
				required = append(required, name)
			}
		}
		g.schemas[t.Name()] = map[string]any{"type": "object", "properties": props, "required": required}
		return ref
	}
	panic("orchestrator: no JSON schema for " + t.String())
}

// openAPI answers GET /api/openapi.json.
func (a *api) openAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Write(a.doc)
}
