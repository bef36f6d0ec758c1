# A stand-in for the official docker:cli image, for machines that cannot pull:
# the docker CLI and the Compose v2 plugin, at the paths docker:cli has them.
# tests/docker/ensure-compose.sh builds it as vramctl-docker-cli:local from a
# temporary context holding this file, this machine's `docker` and its
# `docker-compose` plugin; the controller's Dockerfile copies both out of it.
FROM scratch
COPY docker /usr/local/bin/docker
COPY docker-compose /usr/local/libexec/docker/cli-plugins/docker-compose
