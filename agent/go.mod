module resource-functions.dev/agent

go 1.19
