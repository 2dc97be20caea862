# One image for the API, the migrations and the workers (CPU build of torch; a GPU deployment
# builds FROM a CUDA base image with the same steps).
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 COMERA_HOME=/var/lib/comera
COPY pyproject.toml README.md ./
COPY engine ./engine
COPY api_schemas ./api_schemas
COPY service ./service
COPY worker ./worker
COPY migrations ./migrations
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu -e . \
    && useradd --system --uid 10001 comera && mkdir -p /var/lib/comera \
    && chown comera /var/lib/comera
USER comera
EXPOSE 8000
CMD ["comera", "api", "--host", "0.0.0.0", "--port", "8000"]
