/* The layout of the public structures, as compiled into this library
 * (refit_abi_layout, refit_struct_size): bindings that mirror them by hand
 * (python/refit/_lib.py) are checked against it field by field, so that a
 * field added here cannot silently shift their view.  Every field of every
 * public structure is listed; tests/python/test_abi.py also checks that the
 * listed fields leave no gap a field could hide in. */
#include <stddef.h>
#include <string.h>

#include "refit/experimental/all.h"

#define ABI_STRUCT(type)             \
    {                                \
#type, NULL, 0, sizeof(type) \
    }
#define ABI_FIELD(type, f)                                   \
    {                                                        \
#type, #f, offsetof(type, f), sizeof(((type *)0)->f) \
    }

static const refit_abi_field_t g_layout[] = {
    ABI_STRUCT(refit_abi_field_t),
    ABI_FIELD(refit_abi_field_t, structure),
    ABI_FIELD(refit_abi_field_t, field),
    ABI_FIELD(refit_abi_field_t, offset),
    ABI_FIELD(refit_abi_field_t, size),

    ABI_STRUCT(refit_tensor_info_t),
    ABI_FIELD(refit_tensor_info_t, name),
    ABI_FIELD(refit_tensor_info_t, dtype),
    ABI_FIELD(refit_tensor_info_t, ndim),
    ABI_FIELD(refit_tensor_info_t, shape),

    ABI_STRUCT(refit_manifest_identity_t),
    ABI_FIELD(refit_manifest_identity_t, model),
    ABI_FIELD(refit_manifest_identity_t, layout),
    ABI_FIELD(refit_manifest_identity_t, rank),
    ABI_FIELD(refit_manifest_identity_t, world),

    ABI_STRUCT(refit_placement_t),
    ABI_FIELD(refit_placement_t, canon),
    ABI_FIELD(refit_placement_t, local),
    ABI_FIELD(refit_placement_t, ndim),
    ABI_FIELD(refit_placement_t, canon_offset),
    ABI_FIELD(refit_placement_t, extent),
    ABI_FIELD(refit_placement_t, local_offset),

    ABI_STRUCT(refit_plan_params_t),
    ABI_FIELD(refit_plan_params_t, size),
    ABI_FIELD(refit_plan_params_t, split_bytes),
    ABI_FIELD(refit_plan_params_t, balance_seed),
    ABI_FIELD(refit_plan_params_t, use_seed),
    ABI_FIELD(refit_plan_params_t, no_coalesce),

    ABI_STRUCT(refit_plan_stats_t),
    ABI_FIELD(refit_plan_stats_t, size),
    ABI_FIELD(refit_plan_stats_t, bytes_written),
    ABI_FIELD(refit_plan_stats_t, bytes_read),
    ABI_FIELD(refit_plan_stats_t, bytes_redundant),
    ABI_FIELD(refit_plan_stats_t, bytes_fill),
    ABI_FIELD(refit_plan_stats_t, regions),
    ABI_FIELD(refit_plan_stats_t, fills),
    ABI_FIELD(refit_plan_stats_t, pieces),
    ABI_FIELD(refit_plan_stats_t, sources_used),
    ABI_FIELD(refit_plan_stats_t, plan_ms),

    ABI_STRUCT(refit_truth_report_t),
    ABI_FIELD(refit_truth_report_t, size),
    ABI_FIELD(refit_truth_report_t, elements_checked),
    ABI_FIELD(refit_truth_report_t, bytes_checked),
    ABI_FIELD(refit_truth_report_t, mismatches),

    ABI_STRUCT(refit_publisher_params_t),
    ABI_FIELD(refit_publisher_params_t, size),
    ABI_FIELD(refit_publisher_params_t, registry),
    ABI_FIELD(refit_publisher_params_t, job),
    ABI_FIELD(refit_publisher_params_t, group),
    ABI_FIELD(refit_publisher_params_t, transports),
    ABI_FIELD(refit_publisher_params_t, transport_options),
    ABI_FIELD(refit_publisher_params_t, mode),
    ABI_FIELD(refit_publisher_params_t, heartbeat_ms),
    ABI_FIELD(refit_publisher_params_t, dead_ms),
    ABI_FIELD(refit_publisher_params_t, device),
    ABI_FIELD(refit_publisher_params_t, delta),
    ABI_FIELD(refit_publisher_params_t, delta_max_pct),
    ABI_FIELD(refit_publisher_params_t, delta_threads),
    ABI_FIELD(refit_publisher_params_t, secret_file),
    ABI_FIELD(refit_publisher_params_t, insecure),
    ABI_FIELD(refit_publisher_params_t, lease_ms),
    ABI_FIELD(refit_publisher_params_t, no_digest),

    ABI_STRUCT(refit_receiver_params_t),
    ABI_FIELD(refit_receiver_params_t, size),
    ABI_FIELD(refit_receiver_params_t, registry),
    ABI_FIELD(refit_receiver_params_t, job),
    ABI_FIELD(refit_receiver_params_t, group),
    ABI_FIELD(refit_receiver_params_t, transports),
    ABI_FIELD(refit_receiver_params_t, transport_options),
    ABI_FIELD(refit_receiver_params_t, reader),
    ABI_FIELD(refit_receiver_params_t, lease_ms),
    ABI_FIELD(refit_receiver_params_t, threads),
    ABI_FIELD(refit_receiver_params_t, verify),
    ABI_FIELD(refit_receiver_params_t, device),
    ABI_FIELD(refit_receiver_params_t, relay_slot),
    ABI_FIELD(refit_receiver_params_t, max_readers),
    ABI_FIELD(refit_receiver_params_t, chunk_kb),
    ABI_FIELD(refit_receiver_params_t, relay_heartbeat_ms),
    ABI_FIELD(refit_receiver_params_t, no_delta),
    ABI_FIELD(refit_receiver_params_t, truth_fraction),
    ABI_FIELD(refit_receiver_params_t, secret_file),
    ABI_FIELD(refit_receiver_params_t, insecure),
    ABI_FIELD(refit_receiver_params_t, no_digest),
    ABI_FIELD(refit_receiver_params_t, fp8),

    ABI_STRUCT(refit_pull_report_t),
    ABI_FIELD(refit_pull_report_t, size),
    ABI_FIELD(refit_pull_report_t, version),
    ABI_FIELD(refit_pull_report_t, bytes),
    ABI_FIELD(refit_pull_report_t, sources),
    ABI_FIELD(refit_pull_report_t, planned),
    ABI_FIELD(refit_pull_report_t, manifests_read),
    ABI_FIELD(refit_pull_report_t, wait_ms),
    ABI_FIELD(refit_pull_report_t, discover_ms),
    ABI_FIELD(refit_pull_report_t, plan_ms),
    ABI_FIELD(refit_pull_report_t, transfer_ms),
    ABI_FIELD(refit_pull_report_t, verify_ms),
    ABI_FIELD(refit_pull_report_t, total_ms),
    ABI_FIELD(refit_pull_report_t, transport),
    ABI_FIELD(refit_pull_report_t, lanes),
    ABI_FIELD(refit_pull_report_t, requests),
    ABI_FIELD(refit_pull_report_t, launches),
    ABI_FIELD(refit_pull_report_t, connect_ms),
    ABI_FIELD(refit_pull_report_t, begin_s),
    ABI_FIELD(refit_pull_report_t, end_s),
    ABI_FIELD(refit_pull_report_t, transfer_begin_s),
    ABI_FIELD(refit_pull_report_t, delta_base),
    ABI_FIELD(refit_pull_report_t, delta_units),
    ABI_FIELD(refit_pull_report_t, digest_bytes),
    ABI_FIELD(refit_pull_report_t, unverified_bytes),
    ABI_FIELD(refit_pull_report_t, digest_ms),
    ABI_FIELD(refit_pull_report_t, stamp_ms),
    ABI_FIELD(refit_pull_report_t, unstamped_sources),
    ABI_FIELD(refit_pull_report_t, path),
    ABI_FIELD(refit_pull_report_t, digest_fused),

    ABI_STRUCT(refit_holder_stat_t),
    ABI_FIELD(refit_holder_stat_t, size),
    ABI_FIELD(refit_holder_stat_t, name),
    ABI_FIELD(refit_holder_stat_t, bytes),
    ABI_FIELD(refit_holder_stat_t, chunks),
    ABI_FIELD(refit_holder_stat_t, steals),
    ABI_FIELD(refit_holder_stat_t, failed),
    ABI_FIELD(refit_holder_stat_t, early),
    ABI_FIELD(refit_holder_stat_t, ahead),
    ABI_FIELD(refit_holder_stat_t, late),

    ABI_STRUCT(refit_publish_delta_t),
    ABI_FIELD(refit_publish_delta_t, size),
    ABI_FIELD(refit_publish_delta_t, version),
    ABI_FIELD(refit_publish_delta_t, base_version),
    ABI_FIELD(refit_publish_delta_t, bytes),
    ABI_FIELD(refit_publish_delta_t, region_bytes),
    ABI_FIELD(refit_publish_delta_t, changed_units),
    ABI_FIELD(refit_publish_delta_t, encode_ms),
    ABI_FIELD(refit_publish_delta_t, table_from_delta),

    ABI_STRUCT(refit_fp8_relay_report_t),
    ABI_FIELD(refit_fp8_relay_report_t, size),
    ABI_FIELD(refit_fp8_relay_report_t, version),
    ABI_FIELD(refit_fp8_relay_report_t, bf16_bytes),
    ABI_FIELD(refit_fp8_relay_report_t, fp8_bytes),
    ABI_FIELD(refit_fp8_relay_report_t, pull_ms),
    ABI_FIELD(refit_fp8_relay_report_t, wait_ms),
    ABI_FIELD(refit_fp8_relay_report_t, stage_ms),
    ABI_FIELD(refit_fp8_relay_report_t, publish_ms),

    ABI_STRUCT(refit_select_report_t),
    ABI_FIELD(refit_select_report_t, size),
    ABI_FIELD(refit_select_report_t, locals),
    ABI_FIELD(refit_select_report_t, canon_named),
    ABI_FIELD(refit_select_report_t, canon_pulled),
    ABI_FIELD(refit_select_report_t, bytes),

    ABI_STRUCT(refit_plan_region_t),
    ABI_FIELD(refit_plan_region_t, src),
    ABI_FIELD(refit_plan_region_t, src_region),
    ABI_FIELD(refit_plan_region_t, dst_region),
    ABI_FIELD(refit_plan_region_t, nloops),
    ABI_FIELD(refit_plan_region_t, src_offset),
    ABI_FIELD(refit_plan_region_t, dst_offset),
    ABI_FIELD(refit_plan_region_t, run),
    ABI_FIELD(refit_plan_region_t, count),
    ABI_FIELD(refit_plan_region_t, src_stride),
    ABI_FIELD(refit_plan_region_t, dst_stride),

    ABI_STRUCT(refit_plan_key_t),
    ABI_FIELD(refit_plan_key_t, src),
    ABI_FIELD(refit_plan_key_t, dst),

    ABI_STRUCT(refit_delta_params_t),
    ABI_FIELD(refit_delta_params_t, format),
    ABI_FIELD(refit_delta_params_t, block_bytes),
    ABI_FIELD(refit_delta_params_t, threads),

    ABI_STRUCT(refit_delta_info_t),
    ABI_FIELD(refit_delta_info_t, size),
    ABI_FIELD(refit_delta_info_t, base_version),
    ABI_FIELD(refit_delta_info_t, version),
    ABI_FIELD(refit_delta_info_t, region_bytes),
    ABI_FIELD(refit_delta_info_t, nchunks),
    ABI_FIELD(refit_delta_info_t, header_bytes),
    ABI_FIELD(refit_delta_info_t, total_bytes),
    ABI_FIELD(refit_delta_info_t, changed_units),
    ABI_FIELD(refit_delta_info_t, sparse_chunks),
    ABI_FIELD(refit_delta_info_t, dense_chunks),
    ABI_FIELD(refit_delta_info_t, block_chunks),

    ABI_STRUCT(refit_delta_apply_stats_t),
    ABI_FIELD(refit_delta_apply_stats_t, size),
    ABI_FIELD(refit_delta_apply_stats_t, units_written),
    ABI_FIELD(refit_delta_apply_stats_t, bytes_written),

    ABI_STRUCT(refit_fp8_tensor_t),
    ABI_FIELD(refit_fp8_tensor_t, name),
    ABI_FIELD(refit_fp8_tensor_t, dtype),
    ABI_FIELD(refit_fp8_tensor_t, ndim),
    ABI_FIELD(refit_fp8_tensor_t, shape),
    ABI_FIELD(refit_fp8_tensor_t, offset),
    ABI_FIELD(refit_fp8_tensor_t, bytes),
    ABI_FIELD(refit_fp8_tensor_t, local),
};

const refit_abi_field_t *refit_abi_layout(size_t *count)
{
    if (count) *count = sizeof(g_layout) / sizeof(g_layout[0]);
    return g_layout;
}

size_t refit_struct_size(const char *name)
{
    for (size_t i = 0; name && i < sizeof(g_layout) / sizeof(g_layout[0]); i++)
        if (!g_layout[i].field && !strcmp(g_layout[i].structure, name)) return g_layout[i].size;
    return 0;
}
