package bench

import "runtime"

func runtimeCores() int { return runtime.NumCPU() }
