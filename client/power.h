/* cotrain client: is the host on mains power?
 *
 * Reads <power_supply_dir>/<supply>/type and online (the kernel's
 * /sys/class/power_supply): on AC when a "Mains" supply is online, or when
 * there is no battery at all (a desktop or a server); on battery when
 * batteries exist and no mains supply is online. */
#ifndef CL_POWER_H
#define CL_POWER_H

/* 1 on mains power (or unknown), 0 on battery. */
int cl_power_on_ac(const char *power_supply_dir);

#endif
