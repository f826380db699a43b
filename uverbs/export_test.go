package uverbs

// SetUseIoctl lets external tests force the write() fallbacks.
func SetUseIoctl(on bool) { useIoctl = on }
