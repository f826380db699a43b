// Package httpmeta speaks Mooncake's HTTP metadata protocol, both ways:
// Store publishes te's segment (translated to Mooncake's descriptor) to a
// Mooncake HTTP metadata server and reads Mooncake segments from one, and
// Handler is a Mooncake-compatible metadata server over a Backend (in
// memory, or Consul's KV for a replicated deployment), which `te metadata
// serve` runs.
//
// The protocol (Mooncake 777cc778, transfer_metadata_plugin.cpp and its
// example server): GET, PUT and DELETE on <url>?key=<url-escaped key>, a
// JSON body, and only HTTP 200 counts as success. A segment's descriptor is
// kept under mooncake/[<cluster>/]ram/<segment name> (a name containing "/"
// goes under mooncake/[<cluster>/]<name> as it is), and where its owner's
// RPC (handshake) socket and data host are, under
// mooncake/[<cluster>/]rpc_meta/<server name> as
// {"ip_or_host_name": ..., "rpc_port": ...}. The cluster id is Mooncake's
// MC_METADATA_CLUSTER_ID.
package httpmeta

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/rdmago/te/segment"
)

// EnvClusterID is Mooncake's environment variable for the cluster id.
const EnvClusterID = "MC_METADATA_CLUSTER_ID"

// MaxValue bounds a value read from or written to a metadata server.
const MaxValue = 4 << 20

// Mooncake's client timeouts.
const (
	DefaultTimeout        = 3 * time.Second
	DefaultConnectTimeout = 1500 * time.Millisecond
)

// prefix returns "mooncake/" or "mooncake/<cluster>/".
func prefix(cluster string) string {
	if cluster == "" {
		return "mooncake/"
	}
	return "mooncake/" + strings.TrimSuffix(cluster, "/") + "/"
}

// SegmentKey is the key of a segment's descriptor.
func SegmentKey(cluster, name string) string {
	if strings.Contains(name, "/") {
		return prefix(cluster) + name
	}
	return prefix(cluster) + "ram/" + name
}

// RPCMetaKey is the key of a server's RPC location.
func RPCMetaKey(cluster, server string) string {
	return prefix(cluster) + "rpc_meta/" + server
}

// RPCMeta is the value under RPCMetaKey.
type RPCMeta struct {
	IPOrHostName string `json:"ip_or_host_name"`
	RPCPort      uint16 `json:"rpc_port"`
}

// Client reads and writes keys on a Mooncake HTTP metadata server.
type Client struct {
	// URL is the server's endpoint, http(s)://host:port/path.
	URL string
	// HTTP is the client used; nil uses one with Mooncake's timeouts
	// (3 s per request, 1.5 s to connect).
	HTTP *http.Client
}

// NewClient checks u and returns a Client for it.
func NewClient(u string) (*Client, error) {
	pu, err := url.Parse(u)
	if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
		return nil, fmt.Errorf("httpmeta: %q is not an http(s)://host:port/path URL", u)
	}
	if pu.RawQuery != "" || pu.Fragment != "" {
		return nil, fmt.Errorf("httpmeta: %q: the URL must have no query or fragment (the key is added as ?key=)", u)
	}
	return &Client{URL: u, HTTP: defaultHTTP()}, nil
}

func defaultHTTP() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: DefaultConnectTimeout}).DialContext
	tr.Proxy = nil // metadata stays on the cluster network
	return &http.Client{Transport: tr, Timeout: DefaultTimeout}
}

func (c *Client) http() *http.Client {
	if c.HTTP == nil {
		c.HTTP = defaultHTTP()
	}
	return c.HTTP
}

// ErrStatus is wrapped by errors for replies other than 200 and 404.
var ErrStatus = errors.New("httpmeta: metadata server refused")

func (c *Client) do(ctx context.Context, method, key string, body []byte) ([]byte, error) {
	u := c.URL + "?key=" + url.QueryEscape(key)
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("httpmeta: %s %s: %w", method, key, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: httpmeta: %s %s: %w", segment.ErrUnavailable, method, key, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxValue+1))
	if err != nil {
		return nil, fmt.Errorf("%w: httpmeta: %s %s: reading the reply: %w", segment.ErrUnavailable, method, key, err)
	}
	if len(b) > MaxValue {
		return nil, fmt.Errorf("%w: httpmeta: %s %s: reply above %d bytes", ErrStatus, method, key, MaxValue)
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return b, nil
	case http.StatusNotFound:
		return nil, fmt.Errorf("%w: httpmeta: %s %s", segment.ErrNotFound, method, key)
	}
	return nil, fmt.Errorf("%w: %s %s: HTTP %d %.100q", ErrStatus, method, key, resp.StatusCode, b)
}

// Get returns a key's value; an error wrapping segment.ErrNotFound when
// the server answers 404.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	return c.do(ctx, http.MethodGet, key, nil)
}

// Put sets a key's value.
func (c *Client) Put(ctx context.Context, key string, value []byte) error {
	if len(value) > MaxValue {
		return fmt.Errorf("httpmeta: PUT %s: %d bytes exceed %d", key, len(value), MaxValue)
	}
	if value == nil {
		value = []byte{}
	}
	_, err := c.do(ctx, http.MethodPut, key, value)
	return err
}

// Delete removes a key.
func (c *Client) Delete(ctx context.Context, key string) error {
	_, err := c.do(ctx, http.MethodDelete, key, nil)
	return err
}
