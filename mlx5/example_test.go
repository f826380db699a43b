//go:build amd64 || arm64

package mlx5_test

import (
	"fmt"
	"log"

	"github.com/rdmago/te/mlx5"
	"github.com/rdmago/te/uverbs"
)

// Open a ConnectX device with the mlx5 provider. Programs that support
// several NIC families pass every provider; the device's kernel driver
// picks one.
func ExampleProvider() {
	p := mlx5.Provider()
	fmt.Println(p.Name(), "drives kernel driver", p.DriverID())
	ctx, err := uverbs.Open("mlx5_0", &uverbs.Options{Providers: []uverbs.Provider{p}})
	if err != nil {
		log.Println("no ConnectX here:", err)
		return
	}
	defer ctx.Close()
	log.Println("opened", ctx.Device().Name, "with", ctx.Provider().Name())
	// Output: mlx5 drives kernel driver mlx5
}
