module workflow-streams/bench/loadgen

go 1.22
