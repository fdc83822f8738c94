# The leafpool image: the library, the Celery workers (`celery -A workers ...`), Flower and
# the HTTP service (`leafpool serve`). docker-compose.yml runs every role from it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LEAFPOOL_HOME=/var/lib/leafpool

WORKDIR /src
# the locked dependencies first (exact versions with hashes, ./dev lock): runtime, monitor
# (Flower) and mysql8 (PyMySQL[rsa]: MySQL 8's caching_sha2_password needs RSA without TLS)
COPY requirements/run.txt ./requirements/run.txt
RUN pip install --require-hashes -r requirements/run.txt
COPY pyproject.toml README.md ./
COPY leafpool ./leafpool
COPY workers ./workers

RUN pip install --no-deps . \
    && useradd --system --uid 10001 --create-home --home-dir /var/lib/leafpool leafpool

USER leafpool
WORKDIR /var/lib/leafpool
EXPOSE 8080 5555
# the HTTP service's liveness on the address and port `leafpool serve` listens on (the same
# LEAFPOOL_HTTP_HOST / LEAFPOOL_HTTP_PORT); services running another command set their own
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 CMD ["leafpool", "probe", "http"]
CMD ["leafpool", "serve"]
