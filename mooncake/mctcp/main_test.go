package mctcp

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/rdmago/te/engine"
	"github.com/rdmago/te/engine/transporttest"
)

func factory(testing.TB) engine.Transport { return New(Config{}) }

func TestMain(m *testing.M) {
	transporttest.ServeTargetIfChild(func() engine.Transport { return New(Config{}) })
	goleak.VerifyTestMain(m)
}
