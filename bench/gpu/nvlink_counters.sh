#!/usr/bin/env bash
# NVLink counters against payload, for the copy engine and for SM stores
# (issue 12 item 3). Runs nvlink_study for each kind of traffic and reads,
# before and after, every counter source this machine offers:
#   1. nvidia-smi nvlink -gt d   (per-link data Tx/Rx, KiB)
#   2. nvidia-smi nvlink -gt r   (per-link raw Tx/Rx incl. protocol, KiB)
#   3. NVML field values through nvidia-smi --query-gpu is not exposed for
#      NVLink; pynvml is tried when Python has it
#   4. Nsight Compute (ncu) NVLink metrics on one SM copy kernel
# Whatever a source refuses is printed as such: on some machines of this
# kind the profilers cannot read counters.
#   nvlink_counters.sh BIN_DIR [BYTES_PER_COPY] [COPIES]
set -uo pipefail
BIN=$1
BYTES=${2:-1073741824}
COPIES=${3:-32}
STUDY=$BIN/nvlink_study

sum_link_kib() {  # $1: d|r, $2: gpu, $3: Tx|Rx -> total KiB over links
  nvidia-smi nvlink -gt "$1" -i "$2" 2>/dev/null |
    awk -v dir="$3" '$0 ~ dir { for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+$/) v = $i; s += v } END { print s + 0 }'
}

echo "## nvidia-smi nvlink status (GPU 0)"
nvidia-smi nvlink -s -i 0 2>&1 | head -30
echo "## counter sources"
for kind in d r; do
  echo "nvidia-smi nvlink -gt $kind -i 0:"
  nvidia-smi nvlink -gt "$kind" -i 0 2>&1 | head -8
done

for mode in ce sm sm-pull; do
  tx0_d=$(sum_link_kib d 0 Tx); rx1_d=$(sum_link_kib d 1 Rx)
  tx0_r=$(sum_link_kib r 0 Tx); rx1_r=$(sum_link_kib r 1 Rx)
  rx0_d=$(sum_link_kib d 0 Rx); tx1_d=$(sum_link_kib d 1 Tx)
  out=$("$STUDY" "$mode" "$BYTES" "$COPIES")
  rc=$?
  dtx0_d=$(( $(sum_link_kib d 0 Tx) - tx0_d )); drx1_d=$(( $(sum_link_kib d 1 Rx) - rx1_d ))
  dtx0_r=$(( $(sum_link_kib r 0 Tx) - tx0_r )); drx1_r=$(( $(sum_link_kib r 1 Rx) - rx1_r ))
  drx0_d=$(( $(sum_link_kib d 0 Rx) - rx0_d )); dtx1_d=$(( $(sum_link_kib d 1 Tx) - tx1_d ))
  payload_kib=$(( BYTES / 1024 * COPIES ))
  echo "## $mode (rc $rc): $out"
  echo "payload_KiB=$payload_kib"
  echo "data:  gpu0_tx=$dtx0_d gpu1_rx=$drx1_d (reverse: gpu1_tx=$dtx1_d gpu0_rx=$drx0_d) KiB"
  echo "raw:   gpu0_tx=$dtx0_r gpu1_rx=$drx1_r KiB"
  if (( payload_kib > 0 )); then
    awk -v p="$payload_kib" -v d="$dtx0_d" -v r="$dtx0_r" -v rr="$drx1_d" -v rv="$dtx1_d" \
      'BEGIN { printf "ratio: data_tx/payload=%.4f raw_tx/payload=%.4f data_rx(gpu1)/payload=%.4f reverse_tx(gpu1)/payload=%.4f\n", d/p, r/p, rr/p, rv/p }'
  fi
done

echo "## pynvml field values"
for py in python3 /opt/torch/.venv/bin/python; do
  command -v "$py" >/dev/null 2>&1 || continue
  "$py" - <<'PY' 2>&1 | head -20 && break
import pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
fields = [("NVLINK_THROUGHPUT_DATA_TX", n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
          ("NVLINK_THROUGHPUT_DATA_RX", n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
          ("NVLINK_THROUGHPUT_RAW_TX", n.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX),
          ("NVLINK_THROUGHPUT_RAW_RX", n.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX)]
vals = n.nvmlDeviceGetFieldValues(h, [f for _, f in fields])
for (name, _), v in zip(fields, vals):
    print(name, "ret", v.nvmlReturn, "value", v.value.ullVal)
PY
done

echo "## ncu NVLink metrics on one SM copy and one CE copy"
if command -v ncu >/dev/null 2>&1; then
  ncu --query-metrics 2>/dev/null | grep -i -E "^nvl" | head -20
  timeout 300 ncu --metrics nvltx__bytes.sum,nvlrx__bytes.sum,nvltx__bytes_data_user.sum,nvltx__bytes_data_protocol.sum \
    "$STUDY" sm $((256 << 20)) 1 2>&1 | tail -25
else
  echo "ncu: not found"
fi
