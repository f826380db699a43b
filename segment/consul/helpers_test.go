package consul_test

import "net/http"

func http1NoKeepAlive() http.Transport {
	return http.Transport{DisableKeepAlives: true}
}
