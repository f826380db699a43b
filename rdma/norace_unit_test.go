//go:build !race

package rdma

const raceOn = false
