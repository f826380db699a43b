//go:build amd64 || arm64

package mlx5_test

import (
	"fmt"

	"github.com/rdmago/te/mlx5"
	"github.com/rdmago/te/uverbs"
)

// Open a ConnectX device with the mlx5 provider. Programs that support
// several NIC families pass every provider; the device's driver picks one.
func ExampleProvider() {
	ctx, err := uverbs.Open("mlx5_0", &uverbs.Options{Providers: []uverbs.Provider{mlx5.Provider()}})
	if err != nil {
		fmt.Println("no ConnectX here:", err != nil)
		return
	}
	defer ctx.Close()
	fmt.Println("opened", ctx.Device().Name, "with", ctx.Provider().Name())
}
