module github.com/pinned-go/pinned

go 1.26.0

require github.com/VictoriaMetrics/metrics v1.45.0

require (
	github.com/valyala/fastrand v1.1.0 // indirect
	github.com/valyala/histogram v1.2.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
