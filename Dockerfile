# vramctl as a container beside Docker Compose.
#
#   docker build -t vramctl .
#
# Run it with the Docker socket and the manifest folder mounted, on the host
# network (serves publish their health paths on the host's loopback, and the
# API binds 127.0.0.1), in the host PID namespace (NVML reports host PIDs; the
# controller attributes them to containers through /proc/<pid>/cgroup), and
# with the NVIDIA runtime's `utility` capability for NVML. See
# docs/deploy/compose-snippet.yml and docs/operations.md.
#
# The image carries no docker CLI: serve containers are started and stopped
# through the socket (`docker start` / `docker stop`), so create them once with
# `docker compose create`; a serve's `up` command needs the controller on the host.
#
# The Docker socket is root-equivalent: whoever can write to it controls the
# host. The image runs as an unprivileged user that reaches the socket only
# through the group you add (`group_add: [<gid of /var/run/docker.sock>]`).

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY controller ./controller
COPY statemachine ./statemachine
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/vramctl --create-home vramctl \
    && chmod 0700 /var/lib/vramctl
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    VRAMCTL_STATE_DIR=/var/lib/vramctl \
    PYTHONUNBUFFERED=1
USER vramctl
VOLUME ["/var/lib/vramctl"]
ENTRYPOINT ["vramctl"]
CMD ["run", "-m", "/srv/stack/serves.toml"]
