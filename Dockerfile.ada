# GENERATED FILE, DO NOT EDIT: `python build.py --arch sm89` renders it from docker/Dockerfile.j2,
# docker/targets.toml and docker/versions.toml (edit those, then run `python build.py --all`).
#
# Target sm89: NVIDIA Ada Lovelace GPUs (RTX 4090, L4, L40S, RTX 6000 Ada: compute capability 8.9).
# Layers go from the slowest- to the fastest-changing: OS packages, the browser desktop's (where the target
# has it), Python venv, torch, the engine, the runtime's dependencies, a model made at build time (cpu),
# the target's labels and settings, build facts, our code. A change to runtime/ rebuilds kilobytes.
# Classic Dockerfile syntax only: the Docker SDK, BuildKit, buildah and Hugging Face all build it.

ARG BASE_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu24.04
FROM ${BASE_IMAGE}

ARG DEBIAN_FRONTEND=noninteractive

LABEL \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="nvidia/cuda:13.0.2-devel-ubuntu24.04" \
      vllm-pod.torch="2.13.0+cu130" \
      vllm-pod.engine="vllm==0.32.0"

ENV \
    PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/opt/app \
    PYTHONUNBUFFERED=1

# OS packages, with no package list or .deb left behind (not every base cleans up after apt).
# SSH host keys go in the layer that made them: each pod generates its own at start.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates \
      cuda-compat-13-0 \
      g++ \
      openssh-server \
      python3.12 \
      python3.12-dev \
      python3.12-venv \
      tini \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_*

# The browser desktop (VL_DESKTOP=on, runtime/pod/desktop.py): its own layer, as rarely changed as the one above.
# noVNC's page is unpacked from its package without the package's dependencies (tools the page never uses);
# its index sends a browser to the page with the settings the desktop is made for.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      fonts-dejavu-core \
      jwm \
      python3-websockify \
      tigervnc-standalone-server \
      tigervnc-tools \
      xterm \
 && apt-get download -o APT::Sandbox::User=root novnc \
 && dpkg-deb -x novnc_*.deb /tmp/novnc \
 && mv /tmp/novnc/usr/share/novnc /usr/share/novnc \
 && echo '<meta http-equiv="refresh" content="0; url=vnc.html?autoconnect=1&amp;resize=remote">' \
      > /usr/share/novnc/index.html \
 && rm -rf /tmp/novnc novnc_*.deb \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/*

# Extra CA certificates (a TLS-intercepting proxy's): the *.crt files of docker/certs/.
COPY docker/certs/ /usr/local/share/ca-certificates/vllm-pod/
RUN update-ca-certificates

# Python: the distribution's own interpreter, in a venv that holds everything else.
RUN python3.12 -m venv /opt/venv

# torch, from PyTorch's index for this target. PIP_FIND_LINKS adds wheel locations (a local mirror),
# PIP_TRUSTED_HOST the plain-http ones among them (build.py sets both for a local directory).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
ARG PIP_FIND_LINKS=
ARG PIP_TRUSTED_HOST=
RUN pip install --no-cache-dir --cert /etc/ssl/certs/ca-certificates.crt --index-url "${TORCH_INDEX_URL}" \
      torch==2.13.0+cu130 \
      torchvision==0.28.0+cu130 \
      torchaudio==2.11.0+cu130

# The engine, from PyPI: the torch above already satisfies its torch pins.
RUN pip install --no-cache-dir --cert /etc/ssl/certs/ca-certificates.crt \
      vllm==0.32.0 \
      flashinfer-python==0.7.0.post1 \
      fastokens==0.3.5 \
      smg==1.13.0

# The runtime's own dependencies.
RUN pip install --no-cache-dir --cert /etc/ssl/certs/ca-certificates.crt \
      starlette==1.10.0 \
      uvicorn==0.54.0 \
      httpx==0.28.1 \
      pydantic==2.14.4 \
      prometheus-client==0.26.0 \
      huggingface_hub==2.4.0 \
      aiohttp==3.14.5 \
      msgspec==0.23.0 \
      httptools==0.9.0

# What sets this target apart, as late as it can come: every layer above is the same for all GPU targets,
# so a builder that has built one builds the next from its cache.
LABEL \
      org.opencontainers.image.title="vllm-pod sm89" \
      org.opencontainers.image.description="vLLM and an Anthropic Messages bridge: NVIDIA Ada Lovelace GPUs (RTX 4090, L4, L40S, RTX 6000 Ada: compute capability 8.9)" \
      vllm-pod.target="sm89" \
      vllm-pod.cuda-arch="8.9"
ENV \
    NVIDIA_DISABLE_REQUIRE=1 \
    TORCH_CUDA_ARCH_LIST=8.9 \
    FLASHINFER_CUDA_ARCH_LIST=8.9

# Build facts, checked against the pins: /opt/.image_prebaked tells the runtime nothing needs installing.
COPY docker/image_facts.py /opt/app/image_facts.py
ARG BASE_IMAGE
ARG GIT_REVISION=unknown
ARG BUILD_DATE=unknown
RUN python /opt/app/image_facts.py --output /opt/.image_prebaked \
      --target sm89 --cuda-arch "8.9" --base-image "${BASE_IMAGE}" \
      --revision "${GIT_REVISION}" --date "${BUILD_DATE}" \
      --pin torch==2.13.0+cu130 \
      --pin torchvision==0.28.0+cu130 \
      --pin torchaudio==2.11.0+cu130 \
      --pin vllm==0.32.0 \
      --pin flashinfer-python==0.7.0.post1 \
      --pin fastokens==0.3.5 \
      --pin smg==1.13.0 \
      --pin starlette==1.10.0 \
      --pin uvicorn==0.54.0 \
      --pin httpx==0.28.1 \
      --pin pydantic==2.14.4 \
      --pin prometheus-client==0.26.0 \
      --pin huggingface_hub==2.4.0 \
      --pin aiohttp==3.14.5 \
      --pin msgspec==0.23.0 \
      --pin httptools==0.9.0

# Our code, last.
COPY runtime/ /opt/app/runtime/

LABEL org.opencontainers.image.revision="${GIT_REVISION}" \
      org.opencontainers.image.created="${BUILD_DATE}"
EXPOSE 8080 22
# Healthy once the model is served (runtime/health.py: VL_PORT's /health names the model); checked
# every 10 s so the pod says so within seconds (one small Python start per check, standard library only).
HEALTHCHECK --interval=10s --timeout=10s --start-period=600s --retries=3 \
  CMD ["/opt/venv/bin/python", "-m", "runtime.health"]
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["/opt/venv/bin/python", "-m", "runtime", "start"]
