// The one-node test cluster's pod sandbox (pause) process: standard library only.
module workflowstreams.dev/pause

go 1.26.0
