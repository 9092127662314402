//go:build tools

// Package controlplane pins the commands built from this module for `go mod tidy`.
package controlplane

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
