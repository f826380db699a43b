package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/rdmago/te/internal/cli"
	"github.com/rdmago/te/mooncake/httpmeta"
)

func init() {
	register(command{
		name:    "metadata",
		summary: "te metadata serve: a Mooncake-compatible HTTP metadata server (in memory, or on Consul)",
		run:     runMetadata,
	})
}

const metadataUse = "te metadata serve [flags]"

func runMetadata(ctx context.Context, args []string) error {
	fs := cli.NewFlagSet("te metadata serve", metadataUse,
		"Serves Mooncake's HTTP metadata protocol (GET, PUT, DELETE on <path>?key=...),\n"+
			"so Mooncake processes started with --metadata_server=http://HOST:PORT/metadata\n"+
			"(and te with --metadata http://...) share segment descriptors. Keys live in\n"+
			"this process's memory, or with --consul in Consul's KV store, where several\n"+
			"servers share them and they outlive each. The protocol has no authentication:\n"+
			"listen on a private network.", os.Stdout)
	listen := fs.String("listen", "127.0.0.1:8080", "listen on this `host:port`")
	path := fs.String("path", httpmeta.DefaultPath, "the endpoint's URL `path`")
	consul := fs.String("consul", "", "keep keys in Consul: the agent's `host:port[/prefix]` (prefix default mooncake-metadata; token from $CONSUL_HTTP_TOKEN)")
	if len(args) == 0 || args[0] != "serve" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fs.PrintHelp(os.Stdout)
			return cli.ErrHelp
		}
		got := "nothing"
		if len(args) > 0 {
			got = cli.Printable(args[0])
		}
		return fs.Usagef("want the subcommand serve, got %s", got)
	}
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fs.Usagef("unexpected arguments %q", strings.Join(fs.Args(), " "))
	}
	if !strings.HasPrefix(*path, "/") {
		return fs.Usagef("--path %s: want a path starting with /", *path)
	}
	return serveMetadata(ctx, os.Stdout, *listen, *path, *consul)
}

// serveMetadata runs the server until ctx ends.
func serveMetadata(ctx context.Context, out io.Writer, listen, path, consul string) error {
	o := httpmeta.ServerOptions{Listen: listen, Path: path, Logger: stderrLogger()}
	backend := "memory"
	if consul != "" {
		addr, prefix, _ := strings.Cut(strings.TrimPrefix(consul, "consul://"), "/")
		if prefix == "" {
			prefix = "mooncake-metadata"
		}
		b, err := httpmeta.NewConsul(addr, prefix)
		if err != nil {
			return err
		}
		o.Backend = b
		backend = "consul://" + addr + "/" + prefix
	}
	s, err := httpmeta.Serve(ctx, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "metadata server %s (keys in %s)\n", s.URL(path), backend)
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.Shutdown(sctx)
}
