# hps-triton on NGC's Triton image: the image's own tritonserver (with its Python backend and
# a stub built for the image's Python 3.12) replaces the nvidia-pytriton server files; the
# rest is the same scripts/setup.sh as on a bare machine.
#
#   docker build -t hps-triton .
#   docker run --gpus all --shm-size=2g -p8000-8002:8000-8002 hps-triton
#
# --shm-size: Triton's Python backend and the host tier live in /dev/shm (Docker's default
# is 64 MB). perf_analyzer is not installed here: use the SDK image
# (nvcr.io/nvidia/tritonserver:24.12-py3-sdk) or the checkout's .venv/bin/perf_analyzer.
#
# 24.12 is Ubuntu 24.04 with Python 3.12 (Triton 2.53, CUDA 12.6). The project pins NumPy 2.4,
# which needs Python >= 3.11, so images built on Ubuntu 22.04 (Python 3.10) cannot run it.
FROM nvcr.io/nvidia/tritonserver:24.12-py3

ENV TRITONSERVER=/opt/tritonserver/bin/tritonserver \
    TRITON_BACKEND_DIR=/opt/tritonserver/backends \
    HPS_EXTRAS=gpu \
    PYTHON=/usr/bin/python3

WORKDIR /opt/hps-triton
COPY . .
RUN bash scripts/setup.sh && rm -rf /root/.cache/pip

EXPOSE 8000 8001 8002
# Inside a container the server must listen beyond loopback for -p to reach it.
CMD [".venv/bin/hps", "serve", "--host", "0.0.0.0"]
