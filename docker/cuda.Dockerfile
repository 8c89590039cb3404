# realsim on a CUDA host: JAX with CUDA 12 + gsplat (optional renderer backend).
# Untested here (no Docker engine, no GPU on the development machines); mirrors scripts/install.sh.
#   docker build -f docker/cuda.Dockerfile -t realsim:cuda .
#   docker run --gpus all realsim:cuda realsim bench
FROM nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04
ENV DEBIAN_FRONTEND=noninteractive MUJOCO_GL=egl REALSIM_VENV=/opt/realsim/venv
RUN apt-get update && apt-get install -y --no-install-recommends \
      software-properties-common && add-apt-repository -y ppa:deadsnakes/ppa && \
    apt-get update && apt-get install -y --no-install-recommends \
      python3.11 python3.11-venv python3.11-dev git cmake g++ make \
      libegl1 libgl1 libosmesa6 libglib2.0-0 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/realsim/src
COPY . .
ENV PYTHON=python3.11
RUN scripts/install.sh
# GPU extras on top of the same pins: jax's CUDA plugin matching the pinned jax, torch + gsplat.
RUN . /opt/realsim/venv/bin/activate && \
    JAX_VERSION=$(python -c "import jax; print(jax.__version__)") && \
    pip install "jax[cuda12]==${JAX_VERSION}" torch gsplat
ENTRYPOINT ["/opt/realsim/src/scripts/with-env"]
CMD ["realsim", "bench"]
