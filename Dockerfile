# tileweave workbench on the CPU: import, plan, generate C/CUDA (CUDA compiled with NVRTC), run with gcc+OpenMP
# (and the CUDA itself under the cuda-sim emulator, built with g++).
# GPU use needs only the NVIDIA container runtime (docker run --gpus all ...) and a host driver R580+:
# the CUDA path is cuda-python (a core dependency), no CUDA toolkit in the image (docs/gpu.md).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 TILEWEAVE_CACHE=/tmp/tileweave-cache
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc g++ libc6-dev graphviz make pocl-opencl-icd \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/tileweave
COPY . .
RUN pip install -e '.[opencl]'

EXPOSE 8501
CMD ["streamlit", "run", "app/streamlit_app.py", "--server.headless", "true", "--server.address", "0.0.0.0"]
