# vramctl as a container beside Docker Compose.
#
#   bin/build-image                 # wheels built on the host, then docker build
#
# The image installs wheels built outside it (bin/build-image puts the project's
# wheel and the locked dependencies' wheels in wheels/ of a temporary context),
# so nothing inside the build reaches a package index. Build arguments:
#   PYTHON_IMAGE      the base: any Debian-like image with python3 (3.11+) and its
#                     venv module (default python:3.11-slim);
#   DOCKER_CLI_IMAGE  where the docker CLI and the Compose v2 plugin come from
#                     (default the official docker:cli image; any image with
#                     /usr/local/bin/docker and
#                     /usr/local/libexec/docker/cli-plugins/docker-compose).
#
# The image carries the docker CLI and Compose v2, so a serve's `up` command
# (`docker compose -f {dir}/docker-compose.yml up -d SERVICE`) runs inside the
# container as written; the plugin lives where the CLI finds it whatever HOME is.
#
# Run it with the Docker socket and the manifest folder mounted (at the same path
# as on the host), on the host network (serves publish their health paths on the
# host's loopback, and the API binds 127.0.0.1), in the host PID namespace (NVML
# reports host PIDs; the controller attributes them to containers through
# /proc/<pid>/cgroup), and with the NVIDIA runtime's `utility` capability for
# NVML. See docs/deploy/compose-snippet.yml and docs/operations.md.
#
# The Docker socket is root-equivalent: whoever can write to it controls the
# host. The image runs as an unprivileged user that reaches the socket only
# through the group you add (`group_add: [<gid of /var/run/docker.sock>]`).

ARG PYTHON_IMAGE=python:3.11-slim
ARG DOCKER_CLI_IMAGE=docker:28-cli

FROM ${DOCKER_CLI_IMAGE} AS docker-cli

FROM ${PYTHON_IMAGE}
SHELL ["/bin/sh", "-eu", "-c"]
COPY --from=docker-cli /usr/local/bin/docker /usr/local/bin/docker
COPY --from=docker-cli /usr/local/libexec/docker/cli-plugins/docker-compose \
    /usr/local/libexec/docker/cli-plugins/docker-compose
# the home is the state volume: made empty (no /etc/skel dotfiles), the user's alone
RUN groupadd --system --gid 10001 vramctl \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/vramctl --no-create-home \
        vramctl \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/vramctl
COPY wheels /tmp/wheels
RUN python3 -m venv /opt/vramctl \
    && /opt/vramctl/bin/python -m pip install --no-index --no-cache-dir \
        --disable-pip-version-check /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels \
    && /opt/vramctl/bin/vramctl --help >/dev/null \
    && docker compose version
ENV PATH=/opt/vramctl/bin:$PATH \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    VRAMCTL_STATE_DIR=/var/lib/vramctl \
    PYTHONUNBUFFERED=1
USER 10001:10001
VOLUME ["/var/lib/vramctl"]
ENTRYPOINT ["vramctl"]
CMD ["run", "-m", "/srv/stack/serves.toml"]
