module localtest/coredns

go 1.26.0

require github.com/coredns/coredns v1.15.0
