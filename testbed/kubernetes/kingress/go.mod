module localtest/kingress

go 1.22
