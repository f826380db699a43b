package tcp

import (
	"testing"
	"time"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/transporttest"
)

func TestConformance(t *testing.T) {
	transporttest.Run(t, func(testing.TB) engine.Transport {
		return New(Config{IOTimeout: 2 * time.Second})
	})
}
