package httpmeta

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
)

// FuzzHandler: any method, key and body get one of the protocol's answers,
// never a panic, and a PUT is read back byte for byte.
func FuzzHandler(f *testing.F) {
	f.Add("PUT", "mooncake/ram/a:1", []byte(`{"name":"a"}`))
	f.Add("GET", "", []byte{})
	f.Add("DELETE", "mooncake/rpc_meta/x", []byte("x"))
	f.Add("PATCH", "k", []byte{0})
	h := Handler(&Memory{}, "", nil)
	f.Fuzz(func(t *testing.T, method, key string, body []byte) {
		if !validMethod(method) {
			return
		}
		req := httptest.NewRequest(method, "/metadata?key="+url.QueryEscape(key), bytes.NewReader(body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		switch w.Code {
		case 200, 400, 404, 405, 413:
		default:
			t.Fatalf("%s %q: status %d", method, key, w.Code)
		}
		if method == "PUT" && w.Code == 200 {
			w = httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("GET", "/metadata?key="+url.QueryEscape(key), nil))
			if w.Code != 200 || !bytes.Equal(w.Body.Bytes(), body) {
				t.Fatalf("read back %d %q, put %q", w.Code, w.Body.Bytes(), body)
			}
		}
	})
}

// validMethod: what httptest.NewRequest accepts (an HTTP token).
func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for _, c := range []byte(m) {
		if c <= ' ' || c >= 0x7f || bytes.IndexByte([]byte(`()<>@,;:\"/[]?={}`), c) >= 0 {
			return false
		}
	}
	return m != http.MethodConnect
}
