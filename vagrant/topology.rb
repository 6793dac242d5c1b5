# Reads a topology JSON written by the lab's own parser (python -m drl.lab.vagrant) and
# turns it into the list of VMs the Vagrantfile defines.  Run it alone to see that
# list as JSON (tests/unit/test_lab_vagrant.py compares it with the lab's plan):
#
#   ruby vagrant/topology.rb vagrant/topologies/baseline.json fps
require "json"
require "shellwords"

module DrlTopology
  # "addr,rate_bps" (TBF), or "addr,rate_bps,delay_ms,jitter_ms,loss_pct" (netem; rate 0: none)
  def self.shaping(l)
    s = "#{l['addr']},#{l['rate_bps'].to_i}"
    l["delay_ms"] ? "#{s},#{l['delay_ms']},#{l['jitter_ms']},#{l['loss_pct']}" : s
  end

  # One hash per VM: name, role, ips (one per link, in link order), intnets,
  # routes, rto_min ("" = the kernel's), shaping, the agent command and its drl.toml (nil if the host
  # runs none) and traffic.
  def self.vms(path, allocator = nil)
    topo = JSON.parse(File.read(path))
    allocator ||= topo["allocators"].first
    agents = topo["agents"].fetch(allocator) do
      raise ArgumentError, "allocator #{allocator} is not in #{path} (#{topo['allocators'].join(', ')})"
    end
    topo["hosts"].map do |h|
      nets = h["links"].map { |l| { "ip" => l["addr"], "intnet" => "drl-#{topo['experiment']}-#{l['net']}" } }
      nets << { "ip" => h["ctl_addr"], "intnet" => "drl-#{topo['experiment']}-ctl" } if h["ctl_addr"]
      agent = agents[h["name"]]
      {
        "name" => h["name"],
        "role" => h["role"],
        "networks" => nets,
        "routes" => h["routes"].map { |r| "#{r['dst']},#{r['via']}" },
        "rto_min" => topo["rto_min"].to_s,
        "shaping" => h["links"].select { |l| l["rate_bps"] || l["delay_ms"] }.map { |l| shaping(l) },
        "agent_iface_addr" => agent && agent["iface_addr"],
        "agent_argv" => agent && agent["argv"],
        "agent_config" => agent && agent["config"],
        "servers" => topo["traffic"].select { |t| t["server"] == h["name"] }.map { |t| t["server_argv"] },
        "clients" => topo["traffic"].select { |t| t["client"] == h["name"] }.map { |t| t["client_argv"] },
      }
    end
  end
end

if __FILE__ == $PROGRAM_NAME
  puts JSON.pretty_generate(DrlTopology.vms(ARGV.fetch(0), ARGV[1]))
end
