//go:build tools

// Package controlplane pins the commands built from this module for `go mod tidy`: the test control
// plane (kube-apiserver; etcd is ./etcd) and the one-node cluster's node (kubelet, kube-proxy) and
// controllers (kube-controller-manager, kube-scheduler), all from one k8s.io/kubernetes version.
package controlplane

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
