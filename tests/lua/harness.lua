-- Runs a rendered burst_buffer.lua outside slurmctld, for tests/unit/test_burst_buffer_lua.py.
-- usage: lua5.1 harness.lua SCRIPT COMMAND ARGS...
--   process FILE [PARTITION ACCOUNT QOS]  each NUL-separated batch script of FILE through
--        slurm_bb_job_process (22.05's arguments, or 24.11's with a job_info table when
--        PARTITION is given); one line per script: "0" or "-1 message"
--   paths JOB_ID SCRIPT PATH_FILE [ARRAY_JOB_ID]  slurm_bb_paths (job_info.array_job_id)
--   data_in JOB_ID SCRIPT                 slurm_bb_data_in; prints "rc message"
--   call NAME                             any other hook, no arguments; prints rc
--   time SCRIPTFILE N [PARTITION ACCOUNT QOS]  N calls of slurm_bb_job_process on one
--        script (23.02 and later's arguments, 26.05's among them; without PARTITION
--        22.05's, which carry no job_info), each timed on the monotonic clock:
--        "p50 p99 max" in ms
slurm = {
	SUCCESS = 0, ERROR = -1, SLURM_BB_BUSY = "BUSY",
	log_info = function(...) end, log_error = function(...) end,
	log_debug = function(...) end, log_verbose = function(...) end,
}
dofile(arg[1])
local command = arg[2]

local function say(rc, message)
	message = (message or ""):gsub("\n", "\\n")
	print(tostring(rc) .. (message ~= "" and (" " .. message) or ""))
end

if command == "process" then
	local fh = assert(io.open(arg[3], "rb"))
	local all = fh:read("*a")
	fh:close()
	local n = 0
	for script in all:gmatch("([^%z]*)%z") do
		n = n + 1
		local path = os.tmpname()
		local out = assert(io.open(path, "wb"))
		out:write(script)
		out:close()
		local rc, message
		if arg[4] then
			local info = { partition = arg[4], account = arg[5], qos = arg[6] }
			rc, message = slurm_bb_job_process(path, "1000", "1000", info)
		else
			rc, message = slurm_bb_job_process(path)
		end
		os.remove(path)
		say(rc, message)
	end
elseif command == "paths" then
	say(slurm_bb_paths(arg[3], arg[4], arg[5], "1000", "1000",
		{ array_job_id = tonumber(arg[6] or "0") }))
elseif command == "data_in" then
	say(slurm_bb_data_in(arg[3], arg[4], "1000", "1000", {}))
elseif command == "time" then
	local clock = require("posix.time")
	local function now()
		local t = clock.clock_gettime(clock.CLOCK_MONOTONIC)
		return t.tv_sec + t.tv_nsec / 1e9
	end
	local info = arg[5] and { partition = arg[5], account = arg[6], qos = arg[7] } or nil
	local took = {}
	for i = 1, tonumber(arg[4]) do
		local t0 = now()
		local rc
		if info then
			rc = slurm_bb_job_process(arg[3], "1000", "1000", info)
		else
			rc = slurm_bb_job_process(arg[3])
		end
		took[i] = (now() - t0) * 1000
	end
	table.sort(took)
	local function at(q) return took[math.max(1, math.ceil(q * #took))] end
	print(string.format("%.4f %.4f %.4f", at(0.5), at(0.99), took[#took]))
else
	say(_G[arg[3]]())
end
