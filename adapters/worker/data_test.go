package worker

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestDataURLFor(t *testing.T) {
	for in, want := range map[string]string{
		"ws://127.0.0.1:7420/control":        "http://127.0.0.1:7420",
		"wss://orch.example:443/control?x=1": "https://orch.example:443",
		"WSS://orch.example/control":         "https://orch.example",
		"http://orch:7420/control":           "http://orch:7420",
		"ftp://orch/control":                 "",
		"not a url":                          "",
		"ws:///control":                      "",
	} {
		got, err := DataURLFor(in)
		if (err != nil) != (want == "") || got != want {
			t.Errorf("DataURLFor(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := NewDataClient("ws://orch/control", nil, nil); !errors.Is(err, ErrBadDataURL) {
		t.Errorf("a ws:// data URL: %v", err)
	}
}

func TestDataErrorSentinels(t *testing.T) {
	for code, want := range map[int]error{
		http.StatusUnauthorized: ErrDataUnauthorized, http.StatusConflict: ErrDataFenced,
		http.StatusNotFound: ErrDataNotFound, http.StatusRequestEntityTooLarge: ErrDataTooLarge,
		http.StatusBadRequest: ErrDataRefused, http.StatusMethodNotAllowed: ErrDataRefused,
	} {
		err := error(&DataError{Status: code, Msg: "m"})
		if !errors.Is(err, want) {
			t.Errorf("HTTP %d is not %v", code, want)
		}
		if code != http.StatusConflict && errors.Is(err, ErrDataFenced) {
			t.Errorf("HTTP %d claims to be fenced", code)
		}
	}
	if errors.Is(&DataError{Status: 503}, ErrDataRefused) {
		t.Error("a 503 is not a refusal of the request")
	}
}

func TestVerifyingReader(t *testing.T) {
	body := "the bytes"
	sum := sha256.Sum256([]byte(body))
	good := &verifyingReader{rc: io.NopCloser(strings.NewReader(body)), h: sha256.New(), want: hex.EncodeToString(sum[:])}
	if b, err := io.ReadAll(good); err != nil || string(b) != body {
		t.Fatalf("matching bytes: %q, %v", b, err)
	}
	bad := &verifyingReader{rc: io.NopCloser(strings.NewReader("other bytes")), h: sha256.New(), want: hex.EncodeToString(sum[:])}
	if _, err := io.ReadAll(bad); !errors.Is(err, ErrDataCorrupt) {
		t.Fatalf("corrupt bytes: %v, want ErrDataCorrupt", err)
	}
}
